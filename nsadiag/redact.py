"""Redaction: what leaves nsadiag for other eyes hides who and where it ran.

``redact(text)`` hides, in this order:

- secrets (nsadiag.secret_patterns): values stored under a name that says secret, matched across
  camelCase, snake_case and kebab-case (``HF_TOKEN=V``, ``accessToken: V``, ``"api_key":
  "V"``, ``\\"password\\": \\"V\\"``, ``token: str = 'V'``, ``PGPASSWORD=V``,
  ``token%3DV``; ``pass`` only where a value is stored under it: ``{'pass': ...}``, not
  "forward pass: 3.2 s"), the value after a credential-like flag (``--token VALUE``,
  ``"--token", "VALUE"`` in a list), the user information of a URL (also without the
  scheme), ``Bearer`` tokens, PEM private key blocks, JWTs, Slack and Discord webhook
  URLs and the well-known token shapes (``ghp_…``, ``github_pat_…``, ``hf_…``, ``sk-…``,
  ``AKIA…``, ``xox?-…``, ``glpat-…``, ``AIza…``, ...);
- the values of this process's secret-looking environment variables wherever they appear
  (at least 6 characters), also upper- or lower-cased, base64-encoded or split over two
  lines;
- ``user@host``; IPv4 addresses; IPv6 addresses in full and compressed forms, short ones
  too (``fe80::1``, ``2001:db8::7``, ``::1`` like ``127.0.0.1``) but not C++ names
  (``c10::add``, ``at::Tensor``);
- home directories (``/home/<user>``, ``C:\\Users\\<user>``, ``~<user>/``), pytest's
  ``pytest-of-<user>``;
- this machine's host names (the name, its FQDN and its bare short name), internal host
  names (``*.internal``, ``*.local``, ``*.corp``, ...), cloud host names made of an
  address (``ip-10-0-3-17``), an address written as one number in a URL
  (``http://0x0a000311/``, ``//167772945:80``), and this process's user names.

The hosts a job's ranks are named by (``shown_hosts``: name -> how it is shown) are the
exception: a many-host verdict is about them, so a report on the job's own machines shows
them as they are (``{name: name}``), and a bundle made for other eyes shows each under one
pseudonym everywhere (``host_pseudonyms``: host-1, host-2, ... in the order of their first
rank), so its verdict still reads. A name that is also a user name stays hidden.

``redact_obj(value)`` redacts a JSON value structurally: every string, the whole value of
a key that names a secret, and the list element after a credential-like flag; a message
that itself holds JSON is redacted as text before any quoting, so escaped quotes cannot
hide it. Redaction is idempotent.

What is hidden is decided when a run is recorded, not when it is rendered:
``record_of_this_process(argv)`` is what this process knows to hide (its host and user
names, its secret environment values, the values after credential-like flags in its own
command line and in ``argv``), which nsadiag.rundir stores in the run directory
(redaction.json, private); ``Redactor.with_recorded(stored)`` hides that and everything
this process knows, so a report rendered later, from a shell without the run's
environment or on another machine, hides what the run's own machine would have.
"""

from __future__ import annotations

import base64
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nsadiag.secret_patterns import REDACTED, hide_secrets, is_secret_flag, is_secret_name

GENERIC_ACCOUNTS = frozenset({"root", "user", "admin", "nobody", "runner", "ubuntu"})
"""Account names shared by countless machines: they identify no one, and "root" or "user"
also occur as ordinary words, so they are not hidden as whole words."""
GENERIC_HOSTS = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
MIN_ENV_SECRET = 6
"""Shorter environment values ("1", "true", "cpu") would hide ordinary words."""
MAX_RECORDED = 1024
"""Entries read from each list of a stored record (a received one may be hostile)."""

# every pattern starts only where its kind of word starts (nsadiag.secret_patterns says why)
_USER_HOST = re.compile(r"(?<![\w.-])[\w.-]++@[\w-]+(?:\.[\w-]+)*+")
_IP = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b")
_H = r"[0-9a-fA-F]{1,4}"
# full IPv6; compressed forms with a leading group (fe80::1, 2001:db8::); ::1 and ::ffff:.
# C++ scopes are excluded by what may surround an address (no identifier character, colon,
# "(" or "<" beside it) and by c10's own names; a Python slice (x[::2]) has no leading group
_IPV6 = re.compile(
    rf"(?<![\w:.])(?!c10d?::)(?:(?:{_H}:){{7}}{_H}|{_H}(?::{_H})*+::(?:{_H}(?::{_H})*+)?|"
    rf"::1|::ffff(?::{_H}){{1,2}})(?:%[\w.]+)?(?![\w:(<])")
_HOME = re.compile(r"/(home|Users)/[^/\s\"'`]+")
# C:\Users\carol (a JSON-escaped C:\\Users\\carol too), and ~dave/ (a user's home)
_WINDOWS_HOME = re.compile(r"(?i)\b([a-z]:(?:\\\\|\\)(?:Users|Documents and Settings)"
                           r"(?:\\\\|\\))[^\\/\s\"'`]++")
_TILDE_HOME = re.compile(r"(?<![\w~/.-])~([a-z_][\w.-]{0,31}+)(?=/|\s|$|[\"'`])")
# an address as a cloud names its hosts (ip-10-0-3-17, ip-10-0-3-17.ec2.internal)
_AWS_HOST = re.compile(r"(?<![\w.-])ip-\d{1,3}-\d{1,3}-\d{1,3}-\d{1,3}(?:\.[\w-]++)*+"
                       r"(?![\w-])")
# an IPv4 address written as one number in a URL's host (http://0x0a000311/, //167772945:80)
_NUMBER_HOST = re.compile(r"(?i)(?<=//)(?:0x[0-9a-f]{8}|\d{8,10})(?=[:/?#\s\"']|$)")
_PYTEST_USER = re.compile(r"pytest-of-[^/\s\"'`]+")
_SHOWN = re.compile("\ue000([0-9]+)\ue001")
"""Where a shown host's name stands while the other host patterns run (private-use
characters around its index: no pattern above matches them)."""
MAX_HOST_NAME = 253
"""The longest DNS name; a longer "host name" in a record is not one."""
_INTERNAL_DOMAIN = r"(?:internal|local|lan|corp|intra|localdomain)"
_INTERNAL_HOST = re.compile(rf"(?<![\w.-])(?:[a-zA-Z0-9-]++\.)+{_INTERNAL_DOMAIN}(?![\w-])")


def machine_names() -> tuple[set[str], set[str]]:
    """(host names, user names) of this machine and process, read when called: the host
    name, its FQDN and the FQDN's first label; $USER/$LOGNAME/$USERNAME and the login."""
    import getpass
    import platform
    import socket

    hosts = {socket.gethostname(), platform.node(), os.environ.get("HOSTNAME", "")}
    try:
        hosts.add(socket.getfqdn())
    except OSError:
        pass
    hosts |= {h.split(".", 1)[0] for h in hosts}  # the bare short name of an FQDN
    users = {os.environ.get(name, "") for name in ("USER", "LOGNAME", "USERNAME")}
    try:
        users.add(getpass.getuser())
    except (KeyError, OSError):
        pass
    # a one-letter name would hide letters of ordinary words
    hosts = {h for h in hosts if len(h) >= 2 and h.lower() not in GENERIC_HOSTS}
    users = {u for u in users if len(u) >= 2 and u not in GENERIC_ACCOUNTS}
    return hosts, users


def secret_env_values(environ: dict[str, str] | None = None) -> set[str]:
    """Values of this process's environment variables whose names say secret."""
    environ = os.environ if environ is None else environ
    return {value for name, value in environ.items()
            if is_secret_name(name) and len(value) >= MIN_ENV_SECRET}


def argv_secret_values(argv: Sequence[str]) -> set[str]:
    """The values a command line gives after credential-like flags (``--token VALUE``,
    ``--token=VALUE``) or assigns to secret names (``HF_TOKEN=VALUE``), at least
    MIN_ENV_SECRET characters long."""
    found = set()
    words = [str(w) for w in argv]
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        if is_secret_flag(flag) and eq:
            found.add(value)
        elif is_secret_flag(word) and i + 1 < len(words):
            found.add(words[i + 1])
        elif eq and is_secret_name(flag):
            found.add(value)
    return {v for v in found if len(v) >= MIN_ENV_SECRET}


def record_of_this_process(argv: Sequence[str] = (), stored: dict[str, Any] | None = None
                           ) -> dict[str, Any]:
    """What a run recorded now must hide (see the module docstring), merged with what was
    ``stored`` for it before: {"schema_version", "hosts", "users", "secrets"}."""
    hosts, users = machine_names()
    secrets = secret_env_values() | argv_secret_values(sys.argv) | argv_secret_values(argv)
    before = _recorded(stored)
    return {"schema_version": 1, "hosts": sorted(hosts | before[0]),
            "users": sorted(users | before[1]), "secrets": sorted(secrets | before[2])}


def _recorded(stored: dict[str, Any] | None) -> tuple[set[str], set[str], set[str]]:
    """(hosts, users, secrets) of a stored record, each entry checked as the live ones
    are (strings long enough not to hide ordinary letters)."""
    if not isinstance(stored, dict):
        return set(), set(), set()

    def strings(key: str, shortest: int) -> set[str]:
        values = stored.get(key)
        return {v for v in values[:MAX_RECORDED] if isinstance(v, str) and len(v) >= shortest} \
            if isinstance(values, list) else set()

    return strings("hosts", 2), strings("users", 2), strings("secrets", MIN_ENV_SECRET)


def _whole_word(name: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w.-]){re.escape(name)}(?![\w-])")


def _shown_word(name: str) -> re.Pattern[str]:
    """A shown host's name as a whole word, with the internal domain written after it, if
    any (dropped: "node3.cluster.internal" is shown as node3's name alone)."""
    return re.compile(rf"(?<![\w.-]){re.escape(name)}"
                      rf"(?:(?:\.[a-zA-Z0-9-]++)*?\.{_INTERNAL_DOMAIN})?(?![\w-])")


class Redactor:
    """The redaction of one machine and process (names and secret values read once)."""

    def __init__(self, hosts: Iterable[str] | None = None, users: Iterable[str] | None = None,
                 secrets: Iterable[str] | None = None,
                 shown_hosts: Mapping[str, str] | None = None):
        found_hosts, found_users = machine_names() if hosts is None or users is None \
            else (set(), set())
        self.hosts = sorted(set(found_hosts if hosts is None else hosts), key=len, reverse=True)
        self.users = sorted(set(found_users if users is None else users), key=len, reverse=True)
        values = secret_env_values() | argv_secret_values(sys.argv) if secrets is None \
            else set(secrets)
        self.secrets = sorted(values, key=len, reverse=True)
        # each value as it is also written: upper or lower case, base64 (standard and URL
        # alphabets, padded or not), and split over two lines (wrapped by a logger)
        self._secret_forms = sorted({form for value in self.secrets
                                     for form in secret_forms(value)}, key=len, reverse=True)
        self._split_secrets = [split_over_lines(value) for value in self.secrets[:64]]
        self.shown = {name: str(alias) for name, alias in
                      list((shown_hosts or {}).items())[:MAX_RECORDED]
                      if 2 <= len(name) <= MAX_HOST_NAME and name not in self.users}
        # the FQDN before its first label, whether shown or hidden: longest first
        names = sorted({*self.hosts, *self.shown}, key=len, reverse=True)
        self._shown_names = [name for name in names if name in self.shown]
        self._host_words = [
            (_shown_word(name), f"\ue000{self._shown_names.index(name)}\ue001")
            if name in self.shown else (_whole_word(name), "<host>") for name in names]
        self._user_words = [_whole_word(u) for u in self.users]

    @classmethod
    def with_recorded(cls, stored: dict[str, Any] | None,
                      shown_hosts: Mapping[str, str] | None = None) -> Redactor:
        """This process's redaction and what a run recorded (``record_of_this_process``),
        the job's hosts shown as ``shown_hosts`` says (see the module docstring)."""
        hosts, users = machine_names()
        more = _recorded(stored)
        return cls(hosts | more[0], users | more[1],
                   secret_env_values() | argv_secret_values(sys.argv) | more[2], shown_hosts)

    def text(self, text: str) -> str:
        """``text`` with everything the module docstring lists hidden."""
        for value in self._secret_forms:
            text = text.replace(value, REDACTED)
        for split in self._split_secrets:
            if "\n" in text or "\\n" in text:
                text = split.sub(REDACTED, text)
        text = hide_secrets(text)
        text = _USER_HOST.sub("<user>@<host>", text)
        text = _IP.sub("<ip>", text)
        text = _IPV6.sub("<ip>", text)
        text = _HOME.sub(r"/\1/<user>", text)
        text = _WINDOWS_HOME.sub(r"\1<user>", text)
        text = _TILDE_HOME.sub("~<user>", text)
        text = _AWS_HOST.sub("<host>", text)
        text = _NUMBER_HOST.sub("<ip>", text)
        text = _PYTEST_USER.sub("pytest-of-<user>", text)
        if self._shown_names:  # a record's own marks would read as a shown host
            text = text.replace("\ue000", "").replace("\ue001", "")
        for word, shown in self._host_words:
            text = word.sub(shown, text)
        text = _INTERNAL_HOST.sub("<host>", text)
        for word in self._user_words:
            text = word.sub("<user>", text)
        if self._shown_names:
            text = _SHOWN.sub(lambda m: self.shown[self._shown_names[int(m[1])]], text)
        return text

    def obj(self, value: Any) -> Any:
        """A JSON value with every string redacted and secret-named keys' values hidden."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(str(k)): (REDACTED if is_secret_name(str(k)) and
                                        isinstance(v, (str, int, float)) and
                                        not isinstance(v, bool) else self.obj(v))
                    for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [REDACTED if i and isinstance(v, str) and isinstance(value[i - 1], str) and
                    is_secret_flag(value[i - 1]) else self.obj(v) for i, v in enumerate(value)]
        return value


def secret_forms(value: str) -> set[str]:
    """A secret value and the forms it is also written in: upper and lower case, base64
    (standard and URL-safe alphabets, with and without padding). Each at least
    MIN_ENV_SECRET long."""
    data = value.encode(errors="surrogateescape")
    encoded = {base64.b64encode(data).decode(), base64.urlsafe_b64encode(data).decode()}
    forms = {value, value.upper(), value.lower(), *encoded, *(e.rstrip("=") for e in encoded)}
    return {form for form in forms if len(form) >= MIN_ENV_SECRET}


def split_over_lines(value: str) -> re.Pattern[str]:
    """``value`` with a line break (real or escaped, a log prefix after it excluded)
    allowed between any two of its characters: a wrapped line still shows it whole."""
    gap = r"(?:\r?\n|\\n)?"
    return re.compile(gap.join(re.escape(char) for char in value))


def host_pseudonyms(hosts: Sequence[str]) -> dict[str, str]:
    """host-1, host-2, ... for ``hosts`` in their order (a bundle's names for the job's
    hosts: the same host under the same name in every file)."""
    return {host: f"host-{i}" for i, host in enumerate(dict.fromkeys(hosts), 1)}


def redact(text: str, hosts: set[str] | None = None, users: set[str] | None = None,
           secrets: set[str] | None = None) -> str:
    """``text`` redacted for this machine (or the given host names, user names and secret
    values); see the module docstring for what is hidden."""
    return Redactor(hosts, users, secrets).text(text)


def redact_obj(value: Any, hosts: set[str] | None = None, users: set[str] | None = None,
               secrets: set[str] | None = None) -> Any:
    """A JSON value redacted structurally (see ``Redactor.obj``)."""
    return Redactor(hosts, users, secrets).obj(value)
