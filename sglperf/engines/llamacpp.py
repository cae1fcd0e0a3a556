"""llama.cpp's llama-server: /props for slots, llamacpp:* series, OpenAI /v1/completions with token ids and
ignore_eos, a new connection per stream (it closes the socket after each), on the GPU only with -ngl > 0."""

from __future__ import annotations

from ..categories import InfraError
from ..records import Ceiling, ServerSample
from .base import Engine, Series, server_count

GPU_LAYER_FLAGS = ("-ngl", "--gpu-layers", "--n-gpu-layers")


class LlamaCpp(Engine):
    name = "llamacpp"
    wire = "openai"
    new_connection_per_request = True
    info_paths = ("/props",)
    series = {
        "output_tokens_total": Series("llamacpp:tokens_predicted_total"),
        "running": Series("llamacpp:requests_processing"),
        "queued": Series("llamacpp:requests_deferred"),
        "decode_steps_total": Series("llamacpp:n_decode_total"),
        "busy_per_decode": Series("llamacpp:n_busy_slots_per_decode"),  # cumulative mean since start
        # speculative decoding: draft tokens the target accepted, counted when a request finishes
        "spec_accepted_total": Series("llamacpp:spec_decode_num_accepted_tokens_total"),
    }

    # The models a profile names, as make_model's arguments. {llamacpp_model_idle12}: the tiny model and 12 layers
    # that add nothing, so its outputs are the tiny model's at 4x the work, and the tiny model drafts it exactly (a
    # target and its cheap draft, as an MTP head or an EAGLE draft serves a large model).
    MODELS = {"{llamacpp_model}": {}, "{llamacpp_model_gpu}": {"gpu": True},
              "{llamacpp_model_idle12}": {"idle_layers": 12}}
    PLACEHOLDERS = ("{llama_server}", "{llama_server_cuda}", *MODELS)

    def sample_from(self, values: dict[str, float], t: float) -> ServerSample:
        """Busy slots summed over decode steps = the cumulative per-step mean x the steps: a counter whose
        difference between scrapes gives the mean running count there (ServerSample.busy_slot_steps_total). Both
        are printed with 6 significant digits: over a 1,000-step window the error is far below one slot."""
        values = dict(values)
        per = values.pop("busy_per_decode", None)
        steps = values.get("decode_steps_total")
        if per is not None and steps is not None:
            values["busy_slot_steps_total"] = per * steps
        return super().sample_from(values, t)

    def prepare(self, argv: list[str]) -> None:
        """Build (CPU or CUDA) and make (tiny F32 or GPU-sized F16) what the launch template names."""
        from . import llamacpp_build as build

        try:
            for part in argv:
                if part in self.PLACEHOLDERS:
                    self._path(part, make=True)
        except build.BuildError as e:
            raise InfraError(str(e)) from None

    @staticmethod
    def _path(part: str, make: bool = False) -> str:
        from . import llamacpp_build as build

        if part in ("{llama_server}", "{llama_server_cuda}"):
            cuda = part == "{llama_server_cuda}"
            return str(build.build(cuda=cuda) if make else build.server_path(cuda=cuda))
        kind = LlamaCpp.MODELS[part]
        gpu, idle = kind.get("gpu", False), kind.get("idle_layers", 0)
        shape = build.GPU_MODEL_SHAPE if gpu else build.MODEL_SHAPE
        return str(build.make_model(shape=shape, f16=gpu, idle_layers=idle) if make
                   else build.model_path(shape, gpu, idle_layers=idle))

    def resolve(self, part: str) -> str:
        if part in self.PLACEHOLDERS:
            return self._path(part)
        return super().resolve(part)

    def ceiling(self, info: dict, isl: int, osl: int) -> Ceiling | None:
        """Each slot decodes one sequence: the slot count is the admission cap that binds. Its KV cells could hold
        slots x (per-slot context // tokens per request) sequences, so the KV is not what binds."""
        slots = server_count(info, "total_slots", where="/props")
        settings = info.get("default_generation_settings")
        n_ctx = server_count(settings if isinstance(settings, dict) else {}, "n_ctx",
                             where="/props default_generation_settings")
        if not slots or not n_ctx:
            return None
        per = isl + osl
        kv = slots * (n_ctx // per)
        return Ceiling(kv, slots, slots, "cap" if slots < kv else "kv", per)

    def uses_gpu(self, argv: list[str]) -> bool:
        for i, a in enumerate(argv):
            flag, _, value = a.partition("=")
            if flag in GPU_LAYER_FLAGS:
                value = value or (argv[i + 1] if i + 1 < len(argv) else "0")
                try:
                    return int(value) > 0
                except ValueError:
                    return value in ("auto", "all")
        return False  # built for the CPU here; a GPU build offloads only when asked
