"""The API key: where it comes from, the one header that carries it, and keeping it (and every other secret) out of
everything the suite writes: logs, reports, result JSON, history."""

from __future__ import annotations

import os

REDACTED = "<redacted>"
SECRET_KEYS = {"api_key", "admin_api_key", "hf_token"}
API_KEY_ENV = "SGLPERF_API_KEY"


def api_key_from_env() -> str | None:
    return os.environ.get(API_KEY_ENV) or None


def auth_headers(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def secrets() -> list[str]:
    key = api_key_from_env()
    return [key] if key else []


def redact(obj, extra: list[str] | None = None):
    """Return a copy with secret-named fields blanked and every secret string replaced, at any depth."""
    words = [s for s in (secrets() + (extra or [])) if s]
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
    out, hide_next = [], False
    for a in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif a in ("--api-key", "--admin-api-key"):
            out.append(a)
            hide_next = True
        elif a.startswith(("--api-key=", "--admin-api-key=")):
            out.append(a.split("=", 1)[0] + "=" + REDACTED)
        else:
            out.append(a)
    return redact(out, extra)
