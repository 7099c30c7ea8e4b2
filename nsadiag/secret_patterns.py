"""Where a text holds a secret: by the name it is stored under, after a credential flag, in
a URL, or by its well-known shape. ``hide_secrets(text)`` hides them all (nsadiag.redact
adds host, user and address redaction around it).

Names. A name says secret when one of its words (split at ``_``, ``-`` and camelCase
humps, compared case-insensitively: ``accessToken``, ``access_token``, ``ACCESS-TOKEN``
are one name) is one of SECRET_WORDS, or, for a key or a ``=`` assignment, one of
KEY_WORDS; when it is written as one word ending in one of COMPOUND_ENDINGS
(``PGPASSWORD``, ``accesstoken``); or when it is one of KNOWN_NAMES (``SSHPASS``). A name
whose last word is ``Error``, ``Exception`` or ``Warning`` is an exception type, never a
secret (``KeyError: 'n_layers'``).

Cost. Redaction runs on whole stdout copies and on exception messages of any length, so
each pattern costs time linear in the text: a pattern starts only where its kind of word
starts (a look-behind says "not inside a word"), repeats are possessive where what follows
could be re-read, and a value is taken to its closing quote or the end of its line, never
searched for past it. The one scan with an unbounded end (a PEM block to its END line) is
a plain substring search from each BEGIN, and each BEGIN is consumed by its block.
"""

from __future__ import annotations

import re
from collections.abc import Callable

REDACTED = "<redacted>"
SECRET_WORDS = frozenset({"token", "secret", "password", "passwd", "key", "apikey",
                          "credential", "credentials", "auth", "authorization", "cookie"})
"""Words of a name that say secret ("pwd" is not one: $PWD is the working directory)."""
KEY_WORDS = SECRET_WORDS | {"pass", "passphrase"}
"""Words of a key (or of a name assigned with "=") that say secret: "pass" also names an
ordinary "forward pass: ...", so it counts only where a value is stored under it."""
COMPOUND_ENDINGS = ("token", "secret", "password", "passwd", "passphrase", "apikey",
                    "privatekey", "accesskey", "secretkey", "accountkey", "authkey")
"""Endings of a name written as one word (``PGPASSWORD``, ``clientsecret``); a bare "key"
or "pass" ending is not one (``monkey``, ``hotkey``, ``bypass``, ``compass``)."""
KNOWN_NAMES = frozenset({"sshpass", "mysqlpwd", "pgpass", "rediscliauth"})
"""Names of well-known tools' secret variables that no rule above catches."""
NOT_SECRET_LAST = frozenset({"error", "errors", "exception", "warning"})

_HUMPS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_SEPARATORS = re.compile(r"[_\-.]+")


def name_words(name: str) -> list[str]:
    """The lower-case words of a name, split at ``_``, ``-``, ``.`` and camelCase humps
    (``APIKey`` -> api, key; ``accessToken`` -> access, token)."""
    return [hump.lower() for part in _SEPARATORS.split(name) for hump in _HUMPS.findall(part)]


def is_secret_name(name: str, stored: bool = True) -> bool:
    """Whether a variable, key or option name says it holds a secret (see the module
    docstring); ``stored``: a value is stored under it (a key, ``NAME=``), where "pass"
    counts too."""
    words = name_words(name)
    if not words or words[-1] in NOT_SECRET_LAST:
        return False
    allowed = KEY_WORDS if stored else SECRET_WORDS
    if any(word in allowed for word in words):
        return True
    compact = "".join(words)
    return compact in KNOWN_NAMES or compact.endswith(COMPOUND_ENDINGS)


_FLAG_WORD = re.compile(r"--?([A-Za-z][\w-]*)")


def is_secret_flag(word: str) -> bool:
    """Whether a command-line word is a flag that takes a credential (``--token``,
    ``--db-password``, ``-api-key``, ``--accessToken``), without any ``=value``."""
    match = _FLAG_WORD.fullmatch(word)
    return bool(match) and is_secret_name(match.group(1))


# a name: starts where no word character or dash is before it, and is read once
_IDENT = r"(?<![\w-])([A-Za-z_][\w-]*+)"
_Q = r"(?:\\?[\"'])"  # a quote, possibly JSON-escaped
# `name: type = value` (an annotated Python parameter or assignment): the value is hidden
_ANNOTATION = r"\s*:\s*[A-Za-z_][\w.]*+(?:\[[^\]\n]{0,200}\])?(?:\s*\|\s*[\w.]++){0,8}\s*=\s*"
# what comes before a value: only that is matched, so that a name that is no secret
# leaves its value to be read again (`RuntimeError: password=V`)
_ASSIGN = re.compile(rf"{_IDENT}({_ANNOTATION}|\s*:?=\s*|\s*:\s+)")  # `:=`: Go
# a quoted key: JSON `"k": `, Python `'k'=`, PHP `'k' => `
_QUOTED = re.compile(rf"{_Q}([A-Za-z_][\w-]*+)({_Q}\s*(?:=>|[:=])\s*)(?={_Q})")
_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*+)(\s+|=)")
_FLAG_ITEM = re.compile(rf"{_Q}(--?[A-Za-z][\w-]*+)({_Q}\s*,\s*)(?={_Q})")
# a URL-encoded pair (`token%3DV`, `%26access_token%3DV`): the value up to an encoded `&`
_ENCODED = re.compile(r"(?:(?<=%26)|(?<=%3[Ff])|(?<![\w%-]))([A-Za-z_][\w-]*+)(%3[Dd])")
# values, matched where a secret name ends: quoted to the closing quote or the end of
# the line, never searched for past it; else up to a delimiter
_NOT_A_VALUE = r"(?!<redacted>|value\b|<\w+>)"
# an unquoted name indexed or called (`token = targets[count].item()`) is code that
# computes a value, not a value: a per-token loop names its variable `token`
_CODE = r"(?![A-Za-z_][\w.]*+[\[(])"
_ESCAPED_QUOTED = r'\\"(?:[^\\\n]|\\(?!"))*+(?:\\")?'  # \"V\" inside a JSON string
_VALUE = re.compile(rf"{_NOT_A_VALUE}({_ESCAPED_QUOTED}|\"[^\"\n]*+\"?|'[^'\n]*+'?|"
                    rf"{_CODE}(?:(?i:bearer|basic|token)\s+)?[^\s\"'`,;}}\])]++)")
_FLAG_VALUE = re.compile(rf"(?!-){_VALUE.pattern}")
_QUOTED_VALUE = re.compile(r"(\\?[\"'])((?:(?!\1).)*+)(\1)?")
_ENCODED_VALUE = re.compile(r"(?:[\w.~+-]|%(?!26)[0-9A-Fa-f]{2})++")
_URL_USERINFO = re.compile(r"(?i)(?<![a-z0-9+.-])([a-z][a-z0-9+.-]*+://)[^\s/?#\"'`<>]+@")
_BARE_USERINFO = re.compile(r"(?<![\w.:/@-])[\w.-]++:[^\s/@\"'`<>]++@(?=[\w-])")
_BEARER = re.compile(r"(?i)\b(bearer)\s+(?!<redacted>)[A-Za-z0-9._~+/=-]{8,}")
_WEBHOOK = re.compile(r"(?i)\b(https?://(?:hooks\.slack\.com/(?:services|workflows|triggers)"
                      r"|(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks)/)[\w/-]++")
_TOKEN_VALUE = re.compile(
    r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|hf_[A-Za-z0-9]{20,}|"
    r"sk-[A-Za-z0-9_-]{20,}|(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{16,}|"
    r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}|"
    r"xox[abposr]-[A-Za-z0-9-]{10,}|xapp-[0-9]-[A-Za-z0-9-]{10,}|glpat-[\w-]{20,}|"
    r"AIza[\w-]{35}|ya29\.[\w-]{20,}|npm_[A-Za-z0-9]{36}|pypi-AgE[\w-]{50,}|"
    r"SG\.[\w-]{16,}\.[\w-]{16,}|hv[sbr]\.[\w-]{20,}|dckr_pat_[\w-]{20,}|"
    r"eyJ[\w-]{10,}+\.[\w-]{4,}+\.[\w-]*+)")  # a JWT: base64url JSON header, payload, sig
_PEM_BEGIN = re.compile(r"-----BEGIN ([A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?)-----")
# a URL's signature (Azure SAS `sig=`, `X-Goog-Signature=`, `X-Amz-Signature=`): a value of
# token characters, so `sig=(2, 3)` in a message stays
_SIGNATURE = re.compile(r"(?i)(?<![\w-])((?:x-(?:goog|amz)-)?signature|sig)=([\w%+/=.-]{8,})")
# an ODBC connection string's `;Pwd=...` (a bare PWD= is the working directory)
_ODBC_PWD = re.compile(r"(?i)(?<=;)(\s*pwd\s*=\s*)(\{[^}\n]*+\}?|[^;\n\"'\\]++)")
_MYSQL = re.compile(r"(?i)(?<![\w-])(?:mysql|mariadb)\w*")
_MYSQL_PASSWORD = re.compile(r"(?<![\w-])(-p)(?![\s-])((?:(?!\\n)[^\s\"'])++)")
# `curl -u user:password`, `--user`, `--proxy-user`: the part after the colon
_USER_FLAG = re.compile(r"(?<![\w-])(-[uU]|--user|--proxy-user)(\s+|=)([^\s:\"'@]++):"
                        r"((?:(?!\\n)[^\s\"'])++)")
# a PuTTY key file: the lines after "Private-Lines: N" (real or escaped line breaks)
_PUTTY_PRIVATE = re.compile(r"(Private-Lines:\s*)(\d{1,3})((?:\r?\n|\\n))")
_PUTTY_LINE = re.compile(r"[A-Za-z0-9+/=]*+(?:\r?\n|\\n)?")
_PUTTY_MAC = re.compile(r"(Private-MAC:\s*)[0-9A-Za-z]++")
# an XML element named for a secret: <password>V</password>
_XML_ELEMENT = re.compile(r"<([A-Za-z_][\w.-]{0,64}+)>([^<\n]{1,500}+)</\1>")


def hide_secrets(text: str) -> str:
    """``text`` with every secret this module finds replaced by ``<redacted>``."""
    text = _hide_pem_blocks(text)
    text = _hide_forms(text)
    text = _hide_values(text, _QUOTED, _QUOTED_VALUE, is_secret_name)
    text = _hide_values(text, _FLAG_ITEM, _QUOTED_VALUE, is_secret_flag)
    text = _hide_values(text, _FLAG, _FLAG_VALUE, is_secret_flag)
    text = _hide_values(text, _ASSIGN, _VALUE, _is_secret_before)
    if "%3" in text:
        text = _hide_values(text, _ENCODED, _ENCODED_VALUE, is_secret_name)
    if "@" in text:
        text = _URL_USERINFO.sub(rf"\1{REDACTED}@", text)
        text = _BARE_USERINFO.sub(f"{REDACTED}@", text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = _WEBHOOK.sub(rf"\1{REDACTED}", text)
    return _TOKEN_VALUE.sub(REDACTED, text)


def _hide_forms(text: str) -> str:
    """The secrets written in one tool's own form: a URL's signature, an ODBC password, a
    MySQL ``-pPASS``, ``curl -u user:password``, a PuTTY key's private lines and MAC, an XML
    element named for a secret."""
    if "ig" in text or "IG" in text:
        text = _SIGNATURE.sub(rf"\1={REDACTED}", text)
    if ";" in text:
        text = _ODBC_PWD.sub(lambda m: m.group(1) + REDACTED, text)
    if _MYSQL.search(text):
        text = "\n".join(_MYSQL_PASSWORD.sub(rf"\1{REDACTED}", line)
                         if _MYSQL.search(line) else line for line in text.split("\n"))
    if "-u" in text or "-U" in text:
        text = _USER_FLAG.sub(rf"\1\2\3:{REDACTED}", text)
    if "Private-" in text:
        text = _hide_putty(text)
    if "</" in text:
        text = _XML_ELEMENT.sub(lambda m: f"<{m[1]}>{REDACTED}</{m[1]}>"
                                if is_secret_name(m[1]) and m[2] != REDACTED else m[0], text)
    return text


def _hide_putty(text: str) -> str:
    """A PuTTY key file's private lines (as many as its "Private-Lines:" says, at most
    999) and its MAC."""
    pieces, at = [], 0
    while (begin := _PUTTY_PRIVATE.search(text, at)) is not None:
        end = begin.end()
        for _ in range(int(begin.group(2))):
            line = _PUTTY_LINE.match(text, end)
            if line is None or line.end() == end:
                break
            end = line.end()
        body = text[begin.end():end]
        if body:  # hidden, with the line break that ended it (a real or an escaped one)
            broke = next((b for b in ("\r\n", "\n", "\\n") if body.endswith(b)), "")
            pieces += [text[at:begin.end()], REDACTED + broke]
        else:
            pieces.append(text[at:end])
        at = end
    pieces.append(text[at:])
    return _PUTTY_MAC.sub(rf"\1{REDACTED}", "".join(pieces))


def _is_secret_before(name: str, sep: str) -> bool:
    """A name before ``=`` (or an annotation and ``=``) by KEY_WORDS, before ``: `` by
    SECRET_WORDS only ("forward pass: 3.2 s" is no secret)."""
    return is_secret_name(name, stored="=" in sep)


def _hide_values(text: str, before: re.Pattern[str], value: re.Pattern[str],
                 secret: Callable[..., bool]) -> str:
    """Hide the ``value`` that follows each match of ``before`` (groups: the name, the
    separator) whose name ``secret`` says is one; quotes around a value are kept.
    The search goes on after the name (not after the separator) and after a hidden value:
    every character is read a bounded number of times."""
    pieces, at, search = [], 0, 0
    while (match := before.search(text, search)) is not None:
        name, sep = match.group(1), match.group(2)
        search = match.end(1)  # a separator may hold the next name (`failed: TOKEN=V`)
        if not (secret(name, sep) if secret is _is_secret_before else secret(name)):
            continue
        found = value.match(text, match.end())
        if found is None:
            continue
        pieces += [text[at:match.end()], _hidden(found.group(0))]
        at = search = max(found.end(), match.end())
    if not pieces:
        return text
    pieces.append(text[at:])
    return "".join(pieces)


def _hidden(value: str) -> str:
    """``<redacted>`` in the quotes ``value`` had (a JSON-escaped one too)."""
    for quote in ('\\"', "\\'", '"', "'"):
        if value.startswith(quote):
            closing = quote if len(value) >= 2 * len(quote) and value.endswith(quote) else ""
            return f"{quote}{REDACTED}{closing}"
    return REDACTED


def _hide_pem_blocks(text: str) -> str:
    """Every PEM private key block from its BEGIN line to its END line (or to the end of
    the text, when it was cut short) becomes one ``<redacted>``, however its lines are
    written (real newlines, ``\\n`` escapes in JSON, a log prefix on each line)."""
    if "PRIVATE KEY" not in text:
        return text
    pieces, at = [], 0
    while (begin := _PEM_BEGIN.search(text, at)) is not None:
        end_line = f"-----END {begin.group(1)}-----"
        end = text.find(end_line, begin.end())
        stop = len(text) if end < 0 else end + len(end_line)
        pieces += [text[at:begin.start()], f"-----BEGIN {begin.group(1)}-----{REDACTED}"
                   f"{end_line if end >= 0 else ''}"]
        at = stop
    pieces.append(text[at:])
    return "".join(pieces)
