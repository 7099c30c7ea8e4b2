"""Secrets in the forms people's logs hold them, each with the part that must never be
shown (every value carries "lanted" so that a leak is found by a plain search), and the
ordinary text around them that reports rely on and redaction must keep.

``PRINTER`` is a script for `nsadiag run`: it prints every form to stdout and to stderr and
raises them in an exception message (tests/nsadiag/core/test_redact_forms.py)."""

from __future__ import annotations

PEM = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEApemPlantedBodyLine1\n"
       "pemPlantedBodyLine2+/==\n-----END RSA PRIVATE KEY-----")
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJqd3RQbGFudGVkIn0."
       "jwtPlantedSig8844")

FORMS = {
    "PGPASSWORD": ("PGPASSWORD=pgPlanted-5521 psql -h db", "pgPlanted"),
    "SSHPASS": ("export SSHPASS='sshPlanted-8830'", "sshPlanted"),
    "camelCase accessToken (JSON)": ('{"accessToken": "accTokPlanted-1177"}', "accTokPlanted"),
    "camelCase clientSecret=": ("clientSecret=cliSecPlanted-2288", "cliSecPlanted"),
    "camelCase privateKey:": ("privateKey: pkPlanted-3399", "pkPlanted"),
    "authToken=": ("authToken=authTokPlanted-4400&x=1", "authTokPlanted"),
    "sessionToken=": ("sessionToken=sessTokPlanted-5511", "sessTokPlanted"),
    "Azure AccountKey=": ("DefaultEndpointsProtocol=https;AccountName=acct;"
                          "AccountKey=azPlantedKey6622+/w==;EndpointSuffix=core.windows.net",
                          "azPlantedKey"),
    "annotated parameter": ("def login(token: str = 'annotPlanted-7733'):", "annotPlanted"),
    "PEM private key block": (PEM, "PlantedBodyLine"),
    "JWT": (f"session cookie {JWT} expired", "jwtPlanted"),
    "Slack webhook": ("post to https://hooks.slack.com/services/T0PLANT01/B0PLANT02/"
                      "slackPlantedHook9955 failed", "slackPlantedHook"),
    "Discord webhook": ("https://discord.com/api/webhooks/123456789012345678/"
                        "discordPlantedHook0066", "discordPlantedHook"),
    "URL-encoded token%3D": ("next=https%3A%2F%2Fx.io%2Fcb%3Fstate%3D1%26token%3D"
                             "urlencPlanted1177%26y%3D2", "urlencPlanted"),
    "AWS access key id": ("aws id AKIAPLANTEDEXAMPLE12 in use", "AKIAPLANTEDEXAMPLE12"),
    "GitHub ghp_": ("ghp_plantedGithubToken0123456789ab", "plantedGithubToken"),
    "GitHub github_pat_": ("github_pat_11PLANTED0abcdefghijklmnopqrstuvwx", "11PLANTED0"),
    "Slack xoxb-": ("slack xoxb-1234567890-plantedSlackBot", "plantedSlackBot"),
    "OpenAI sk-proj-": ("sk-proj-plantedOpenAIkey0123456789", "plantedOpenAIkey"),
    "Hugging Face hf_": ("hf_plantedHuggingFaceToken0123", "plantedHuggingFace"),
    "Google AIza": ("AIzaplantedGoogleKey_0123456789abcdefgh", "plantedGoogleKey"),
    "Stripe sk_live_": ("sk_live_plantedStripe0123456789", "plantedStripe"),
    "GitLab glpat-": ("glpat-plantedGitlab012345678", "plantedGitlab"),
    "npm token": ("npm_plantedNpmToken0123456789abcdefghijk", "plantedNpmToken"),
    "MySQL -pPASS": ("mysql -u root -pmyPlanted-1212 -h db orders", "myPlanted"),
    "Azure SAS sig=": ("GET https://acct.blob.core.windows.net/c/b.pt?sv=2022-11-02&se=2026"
                       "&sp=r&sig=sasPlanted%2BAbC%3D failed: 403", "sasPlanted"),
    "ODBC Pwd=": ("Driver={ODBC Driver 18};Server=db;Uid=etl;Pwd=odbcPlanted-77;Encrypt=yes",
                  "odbcPlanted"),
    "PuTTY private key": ("PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\n"
                          "Comment: me\nPublic-Lines: 1\nAAAAC3NzaC1lZDI1NTE5AAAAIpub\n"
                          "Private-Lines: 1\nAAAAIPuttyPlantedBody0123\n"
                          "Private-MAC: puttyPlantedMac99", "PuttyPlanted"),
    "curl -u user:pw": ("curl -u alice:curlPlanted-42 https://api.x.io/v1", "curlPlanted"),
    "Vault hvs.": ("VAULT says hvs.CAESIvaultPlantedToken0123456789abcd", "vaultPlanted"),
    "Docker dckr_pat_": ("login with dckr_pat_dockerPlantedTok0123456789", "dockerPlanted"),
    "X-Goog-Signature=": ("https://storage.googleapis.com/b/o?X-Goog-Algorithm=GOOG4&"
                          "X-Goog-Signature=googSigPlanted0a1b2c", "googSigPlanted"),
    "PHP => ''": ("$config = ['db_password' => 'phpPlanted-31', 'host' => 'db'];",
                  "phpPlanted"),
    "Go :=": ('apiKey := "goPlanted-5151"', "goPlanted"),
    "XML <password>": ("<user>etl</user><password>xmlPlanted-64</password>", "xmlPlanted"),
}
"""Each form: (the text as it is logged, the part that must not be shown)."""

KEPT = [
    "tokens: 512 per step", "max_tokens=100", "KeyError: 'n_layers'", "forward pass: 3.2 s",
    "/tmp/run/trial-0/stdout.txt", "torch.Size([2, 16, 64])",
    "tensor([0.1234, -1.5e-03, 2.0000e+00])", "step 12/500 loss=3.2514 lr=3e-4",
    "0-1-2-3-4-5-6-7-8-9", "shape (2, 1024, 8, 64) float32", "--tokenizer gpt2",
    "python -c pass", "monkey=3 bypass=4 hotkey=5", "blocks.0.attn.sel at nsa/sel.py:41",
    "sha256:3f5a9c0e", "at 12:34:56", "x[::2]", "c10::add(", "KeyboardInterrupt",
    "token = targets[count].item()", "secret = torch.randn(4)",
    "python -pX", "signature mismatch: (a, b)", "out = x <= 3", "a := b",
    "step 0x7f3a2c1d40 0x10", "tensor signature sig=(2, 3)",
]
"""Ordinary text a report relies on: numbers, shapes, paths and tensor values."""

PRINTER = f"""
import sys
FORMS = {[text for text, _ in FORMS.values()]!r}
for text in FORMS:
    print(text, flush=True)
    print(text, file=sys.stderr, flush=True)
raise RuntimeError("login failed: " + " | ".join(FORMS))
"""
