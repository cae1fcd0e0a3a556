"""What counts as secret, in one list, and keeping every secret out of everything the suite writes: logs, reports,
result JSON, history, Allure. The API key: where it comes from and the one header that carries it.

A secret is known three ways: a flag that holds one (SECRET_FLAGS: the value after it, in any command line the
suite builds or is given), a variable that holds one (SECRET_ENV, in the suite's environment or a profile's
[server] env), and a value registered at run time (a database URL's password). Every writer redacts through
`redact`, which replaces every known value wherever it appears (SGLang prints its own server args into its log)
and blanks every field named like a secret flag.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
from urllib.parse import unquote

from .categories import UsageError

REDACTED = "<redacted>"
# Flags whose value is a secret: SGLang 0.5.23's (--api-key, --admin-api-key, --ssl-keyfile-password: every flag of
# its parser that takes a key or password rather than a path), llama.cpp's --api-key, and Hugging Face's token.
SECRET_FLAGS = ("--api-key", "--admin-api-key", "--ssl-keyfile-password", "--hf-token")
SECRET_ENV = ("SGLPERF_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "PGPASSWORD")
SECRET_KEYS = {f[2:].replace("-", "_") for f in SECRET_FLAGS} | {"password"}
API_KEY_ENV = "SGLPERF_API_KEY"
_registered: set[str] = set()


def api_key_from_env() -> str | None:
    return check_api_key(os.environ.get(API_KEY_ENV) or None, API_KEY_ENV)


def check_api_key(key: str | None, where: str) -> str | None:
    """The key, if an HTTP header can carry it (visible ASCII, no whitespace inside), else a usage error that
    says what is wrong without showing it: a newline or a non-ASCII character made the HTTP client raise an error
    quoting the whole key into tracebacks, Allure and stdout."""
    if key is None:
        return None
    register(key)
    if any(c in key for c in "\r\n"):
        raise UsageError(f"{where}: the API key holds a line break, which an HTTP header cannot carry (not shown)")
    if not all(33 <= ord(c) < 127 for c in key):
        raise UsageError(f"{where}: the API key holds a space, a control or a non-ASCII character, which a bearer "
                         f"token in an HTTP header cannot carry (not shown)")
    return key


def auth_headers(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def register(*values: str | None) -> None:
    """Values that are secret from now on in this process (a flag's value, a profile's secret variable, a URL's
    password), whatever field or text they later appear in."""
    _registered.update(v for v in values if v)


@functools.lru_cache(maxsize=1)
def _public_flags() -> frozenset[str]:
    """The flags of the servers the suite knows (the vendored SGLang flag lists) that hold no secret."""
    from pathlib import Path

    out: set[str] = set()
    for path in (Path(__file__).parent / "data").glob("sglang-*-flags.txt"):
        out |= {ln.strip() for ln in path.read_text().splitlines() if ln.startswith("--")}
    return frozenset(out - set(SECRET_FLAGS))


def secret_flag(flag: str) -> bool:
    """Whether `flag` (the part before any '=') names a secret flag as an argparse server reads it: the flag
    itself, or an abbreviation of one (allow_abbrev: SGLang and the simulator take `--admin-api` for
    `--admin-api-key`), unless it is another flag of its own (`--ssl-keyfile` is a path, not
    `--ssl-keyfile-password`). An abbreviation argparse would find ambiguous is redacted all the same."""
    if flag in SECRET_FLAGS:
        return True
    return (len(flag) > 3 and flag.startswith("--") and any(f.startswith(flag) for f in SECRET_FLAGS)
            and flag not in _public_flags())


def argv_secrets(argv: list[str]) -> list[str]:
    """The values of the secret flags in a command line (`--flag VALUE` and `--flag=VALUE`, abbreviated too)."""
    out = []
    for i, a in enumerate(argv):
        name, eq, value = a.partition("=")
        if not secret_flag(name):
            continue
        if eq:
            out.append(value)
        elif i + 1 < len(argv):
            out.append(argv[i + 1])
    return [v for v in out if v]


def env_secrets(env: dict[str, str]) -> list[str]:
    return [v for k, v in env.items() if k in SECRET_ENV and v]


# Where a connection string keeps its password: libpq's URI query parameters and keyword/value strings.
URL_SECRET_PARAMS = ("password", "sslpassword")


def url_password(url: str) -> str | None:
    """The password a connection string carries, decoded: in its userinfo (user:PASSWORD@, an unencoded @ in it
    included: the host follows the last @), else in a query parameter (?password=), else a libpq keyword
    (password=...)."""
    info = _userinfo(url)
    if info is not None and ":" in info:
        return unquote(info.split(":", 1)[1]) or None
    q = re.search(r"[?&](?:%s)=([^&]*)" % "|".join(URL_SECRET_PARAMS), url)
    if q and q.group(1):
        return unquote(q.group(1))
    m = re.search(r"(?:^|\s)(?:%s)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)" % "|".join(URL_SECRET_PARAMS), url)
    return m.group(1).strip("'") if m else None


def _userinfo(url: str) -> str | None:
    """A URL's user[:password], read as a person wrote it: everything between '//' and the last '@' of the
    authority, an unencoded '/', '?', '#' or '@' in the password included (the host follows the last '@' before
    the path); None where there is none."""
    m = re.match(r"[A-Za-z][A-Za-z0-9+.-]*://(.*)@([^@/?#]*)(?:[/?#].*)?$", url, re.S)
    return m.group(1) if m else None


def url_secrets(url: str) -> list[str]:
    """Every spelling of a connection string's password that may be printed: decoded and as written."""
    pw = url_password(url)
    if not pw:
        return []
    info = _userinfo(url)
    written = info.split(":", 1)[1] if info and ":" in info else None
    q = re.search(r"[?&](?:%s)=([^&]*)" % "|".join(URL_SECRET_PARAMS), url)
    return sorted({pw, written or pw, q.group(1) if q else pw}, key=len, reverse=True)


def without_userinfo(url: str) -> tuple[str | None, str]:
    """(user[:password] as written, the URL without it): what a URL parser can take apart without a password's
    unencoded '/', '?' or '#' cutting the URL short (and its error quoting a piece of the password)."""
    info = _userinfo(url)
    return (info, url.replace(info + "@", "", 1)) if info is not None else (None, url)


def escaped(secret: str) -> list[str]:
    """The forms a secret takes when a server prints it: as is, in a Python repr (SGLang logs its args so), in JSON,
    shell-quoted, percent-encoded: each is replaced wherever it appears."""
    forms = {secret, repr(secret)[1:-1], json.dumps(secret)[1:-1], shlex.quote(secret),
             secret.replace("\\", "\\\\")}
    from urllib.parse import quote

    forms.add(quote(secret, safe=""))
    return [f for f in forms if f]


def secrets() -> list[str]:
    """Every secret known now in every escaped form, longest first (a secret containing another is replaced
    whole)."""
    known = set(env_secrets(dict(os.environ))) | _registered
    return sorted({f for s in known for f in escaped(s)}, key=len, reverse=True)


def redact(obj, extra: list[str] | None = None):
    """Return a copy with secret-named fields blanked and every secret string replaced, at any depth."""
    words = sorted({s for s in (secrets() + (extra or [])) if s}, key=len, reverse=True)
    return _redact(obj, words)


def _redact(obj, words):
    if isinstance(obj, dict):
        return {k: (REDACTED if k in SECRET_KEYS and v else _redact(v, words)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_redact(v, words) for v in obj]
    if isinstance(obj, str):
        for w in words:
            obj = obj.replace(w, REDACTED)
        return obj
    return obj


def redact_argv(argv: list[str], extra: list[str] | None = None) -> list[str]:
    """The command line with every secret flag's value replaced (and every known secret anywhere else)."""
    out, hide_next = [], False
    for a in argv:
        name, eq, _ = a.partition("=")
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif secret_flag(name) and eq:
            out.append(name + "=" + REDACTED)
        elif secret_flag(name):
            out.append(a)
            hide_next = True
        else:
            out.append(a)
    return redact(out, extra)


def redact_url(url: str) -> str:
    """A connection string with its password replaced wherever it keeps one: user:PASSWORD@host (up to the last
    @ before the host), ?password=..., or a libpq keyword password=...; and any registered secret."""
    info = _userinfo(url)
    out = url
    if info is not None and ":" in info:
        out = url.replace("//" + info + "@", "//" + info.split(":", 1)[0] + ":" + REDACTED + "@", 1)
    keys = "|".join(URL_SECRET_PARAMS)
    out = re.sub(r"([?&](?:%s)=)[^&]*" % keys, r"\1" + REDACTED, out)
    out = re.sub(r"((?:^|\s)(?:%s)\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)" % keys, r"\1" + REDACTED, out)
    return redact(out)
