"""What counts as secret, in one list, and keeping every secret out of everything the suite writes: logs, reports,
result JSON, history, Allure. The API key: where it comes from and the one header that carries it.

A secret is known three ways: a flag that holds one (SECRET_FLAGS: the value after it, in any command line the
suite builds or is given), a variable that holds one (SECRET_ENV, in the suite's environment or a profile's
[server] env), and a value registered at run time (a database URL's password). Every writer redacts through
`redact`, which replaces every known value wherever it appears (SGLang prints its own server args into its log)
and blanks every field named like a secret flag.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

REDACTED = "<redacted>"
# Flags whose value is a secret: SGLang 0.5.23's (--api-key, --admin-api-key, --ssl-keyfile-password: every flag of
# its parser that takes a key or password rather than a path), llama.cpp's --api-key, and Hugging Face's token.
SECRET_FLAGS = ("--api-key", "--admin-api-key", "--ssl-keyfile-password", "--hf-token")
SECRET_ENV = ("SGLPERF_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "PGPASSWORD")
SECRET_KEYS = {f[2:].replace("-", "_") for f in SECRET_FLAGS} | {"password"}
API_KEY_ENV = "SGLPERF_API_KEY"
_registered: set[str] = set()


def api_key_from_env() -> str | None:
    return os.environ.get(API_KEY_ENV) or None


def auth_headers(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def register(*values: str | None) -> None:
    """Values that are secret from now on in this process (a flag's value, a profile's secret variable, a URL's
    password), whatever field or text they later appear in."""
    _registered.update(v for v in values if v)


def argv_secrets(argv: list[str]) -> list[str]:
    """The values of the secret flags in a command line (`--flag VALUE` and `--flag=VALUE`)."""
    out = []
    for i, a in enumerate(argv):
        if a in SECRET_FLAGS and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif a.startswith(tuple(f + "=" for f in SECRET_FLAGS)):
            out.append(a.split("=", 1)[1])
    return [v for v in out if v]


def env_secrets(env: dict[str, str]) -> list[str]:
    return [v for k, v in env.items() if k in SECRET_ENV and v]


def url_password(url: str) -> str | None:
    try:
        return urlsplit(url).password or None
    except ValueError:
        return None


def secrets() -> list[str]:
    """Every secret known now, longest first (a secret containing another is replaced whole)."""
    return sorted(set(env_secrets(dict(os.environ))) | _registered, key=len, reverse=True)


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
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif a in SECRET_FLAGS:
            out.append(a)
            hide_next = True
        elif a.startswith(tuple(f + "=" for f in SECRET_FLAGS)):
            out.append(a.split("=", 1)[0] + "=" + REDACTED)
        else:
            out.append(a)
    return redact(out, extra)


def redact_url(url: str) -> str:
    """A URL with its password (user:PASSWORD@host) replaced."""
    pw = url_password(url)
    return re.sub(r"(//[^/@:]*:)[^/@]*@", r"\1" + REDACTED + "@", url) if pw else url
