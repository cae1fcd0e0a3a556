"""Any OpenAI-compatible server (vLLM, TGI, a gateway): /v1/models for the model name, /v1/completions with token
ids; no capacity, flush or server-side series known, so the plateau and client-vs-server checks skip."""

from __future__ import annotations

from .base import Engine


class OpenAI(Engine):
    name = "openai"
    info_paths = ("/v1/models",)
    negotiates = True
