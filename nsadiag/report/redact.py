"""Redaction: what leaves nsadiag for other eyes hides who and where it ran.

``redact(text)`` hides, in this order:

- secret values by name: ``NAME=value``, ``NAME: value`` (a space after the colon:
  ``pkg.per_token_loop:make`` is a factory, not a secret), ``NAME = 'value'``, JSON and
  Python-repr pairs (``"NAME": "value"``, ``'NAME': 'value'``, also with JSON-escaped
  quotes ``\\"NAME\\": \\"value\\"``) whose name has a part (split at ``_`` and ``-``)
  that says token, secret, password, passwd, key, apikey, credential(s), auth,
  authorization or cookie (``aws_secret_access_key``, ``HF_TOKEN``, ``db_password``;
  not ``KeyError``);
- ``Authorization: Bearer|Basic|Token ...`` headers and any ``Bearer <token>``;
- well-known token formats (``ghp_…``, ``github_pat_…``, ``hf_…``, ``sk-…``, ``AKIA…``,
  ``xox?-…``) and the values of this process's secret-looking environment variables
  wherever they appear (at least 6 characters);
- ``user@host``; IPv4 addresses; IPv6 addresses in full and compressed forms, short ones
  too (``fe80::1``, ``2001:db8::7``, ``::1`` like ``127.0.0.1``) but not C++ names
  (``c10::add``, ``at::Tensor``);
- home directories (``/home/<user>``), pytest's ``pytest-of-<user>``;
- this machine's host names (the name, its FQDN and its bare short name), internal host
  names (``*.internal``, ``*.local``, ``*.corp``, ...), and this process's user names.

``redact_obj(value)`` redacts a JSON value structurally: every string, and the whole
value of a key that names a secret; a message that itself holds JSON is redacted as text
before any quoting, so escaped quotes cannot hide it. Redaction is idempotent.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

REDACTED = "<redacted>"
GENERIC_ACCOUNTS = frozenset({"root", "user", "admin", "nobody", "runner", "ubuntu"})
"""Account names shared by countless machines: they identify no one, and "root" or "user"
also occur as ordinary words, so they are not hidden as whole words."""
GENERIC_HOSTS = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
SECRET_WORDS = ("token", "secret", "password", "passwd", "key", "apikey", "credential",
                "credentials", "auth", "authorization", "cookie")
"""Parts of a name that say secret ("pwd" is not one: $PWD is the working directory)."""
MIN_ENV_SECRET = 6
"""Shorter environment values ("1", "true", "cpu") would hide ordinary words."""

_PART = rf"(?:{'|'.join(SECRET_WORDS)})"
# a name one of whose _/- separated parts is a secret word (case-insensitive)
_NAME = rf"(?:[A-Za-z0-9]+[_-])*{_PART}(?:[_-][A-Za-z0-9]+)*"
_Q = r"(?:\\?[\"'])"  # a quote, possibly JSON-escaped
_SECRET_QUOTED = re.compile(rf"(?i)({_Q}{_NAME}{_Q}\s*[:=]\s*)({_Q})((?:(?!\2).)*)\2")
_SECRET_ASSIGN = re.compile(
    rf"(?i)(?<![\w-])({_NAME})(\s*=\s*|\s*:\s+)(?!<redacted>|value\b|<\w+>)"
    r"(\"[^\"\n]*\"|'[^'\n]*'|(?:(?:bearer|basic|token)\s+)?[^\s\"'`,;}\])]+)")
_BEARER = re.compile(r"(?i)\b(bearer)\s+(?!<redacted>)[A-Za-z0-9._~+/=-]{8,}")
_TOKEN_VALUE = re.compile(
    r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|hf_[A-Za-z0-9]{20,}|"
    r"sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,})")
_USER_HOST = re.compile(r"\b[\w.-]+@[\w-]+(?:\.[\w-]+)*\b")
_IP = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b")
_H = r"[0-9a-fA-F]{1,4}"
# full IPv6; compressed forms with a leading group (fe80::1, 2001:db8::); ::1 and ::ffff:.
# C++ scopes are excluded by what may surround an address (no identifier character, colon,
# "(" or "<" beside it) and by c10's own names; a Python slice (x[::2]) has no leading group
_IPV6 = re.compile(
    rf"(?<![\w:.])(?!c10d?::)(?:(?:{_H}:){{7}}{_H}|{_H}(?::{_H})*::(?:{_H}(?::{_H})*)?|"
    rf"::1|::ffff(?::{_H}){{1,2}})(?:%[\w.]+)?(?![\w:(<])")
_HOME = re.compile(r"/(home|Users)/[^/\s\"'`]+")
_PYTEST_USER = re.compile(r"pytest-of-[^/\s\"'`]+")
_INTERNAL_HOST = re.compile(r"\b(?:[a-zA-Z0-9-]+\.)+"
                            r"(?:internal|local|lan|corp|intra|localdomain)\b")
_SECRET_KEY = re.compile(rf"(?i)^{_NAME}$")


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


def is_secret_name(name: str) -> bool:
    """Whether a variable or key name says it holds a secret (see the module docstring)."""
    return bool(_SECRET_KEY.match(name))


def secret_env_values(environ: dict[str, str] | None = None) -> set[str]:
    """Values of this process's environment variables whose names say secret."""
    environ = os.environ if environ is None else environ
    return {value for name, value in environ.items()
            if is_secret_name(name) and len(value) >= MIN_ENV_SECRET}


def _whole_word(name: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w.-]){re.escape(name)}(?![\w-])")


def _assign(match: re.Match[str]) -> str:
    name, sep, value = match.group(1), match.group(2), match.group(3)
    quote = value[0] if value[:1] in ("'", '"') else ""
    return f"{name}{sep}{quote}{REDACTED}{quote}"


class Redactor:
    """The redaction of one machine and process (names and secret values read once)."""

    def __init__(self, hosts: Iterable[str] | None = None, users: Iterable[str] | None = None,
                 secrets: Iterable[str] | None = None):
        found_hosts, found_users = machine_names() if hosts is None or users is None \
            else (set(), set())
        self.hosts = sorted(set(found_hosts if hosts is None else hosts), key=len, reverse=True)
        self.users = sorted(set(found_users if users is None else users), key=len, reverse=True)
        values = secret_env_values() if secrets is None else set(secrets)
        self.secrets = sorted(values, key=len, reverse=True)
        self._host_words = [_whole_word(h) for h in self.hosts]
        self._user_words = [_whole_word(u) for u in self.users]

    def text(self, text: str) -> str:
        """``text`` with everything the module docstring lists hidden."""
        for value in self.secrets:
            text = text.replace(value, REDACTED)
        text = _SECRET_QUOTED.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}{m.group(2)}",
                                  text)
        text = _SECRET_ASSIGN.sub(_assign, text)
        text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
        text = _TOKEN_VALUE.sub(REDACTED, text)
        text = _USER_HOST.sub("<user>@<host>", text)
        text = _IP.sub("<ip>", text)
        text = _IPV6.sub("<ip>", text)
        text = _HOME.sub(r"/\1/<user>", text)
        text = _PYTEST_USER.sub("pytest-of-<user>", text)
        for word in self._host_words:  # the FQDN before its first label
            text = word.sub("<host>", text)
        text = _INTERNAL_HOST.sub("<host>", text)
        for word in self._user_words:
            text = word.sub("<user>", text)
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
            return [self.obj(v) for v in value]
        return value


def redact(text: str, hosts: set[str] | None = None, users: set[str] | None = None,
           secrets: set[str] | None = None) -> str:
    """``text`` redacted for this machine (or the given host names, user names and secret
    values); see the module docstring for what is hidden."""
    return Redactor(hosts, users, secrets).text(text)


def redact_obj(value: Any, hosts: set[str] | None = None, users: set[str] | None = None,
               secrets: set[str] | None = None) -> Any:
    """A JSON value redacted structurally (see ``Redactor.obj``)."""
    return Redactor(hosts, users, secrets).obj(value)
