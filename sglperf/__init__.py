"""sglperf: performance regression tests for LLM serving."""

import os

# OpenBLAS starts a worker thread per core when numpy loads, and an idle one still spins (docs/measurement.md), on a
# core the server may need. Nothing here multiplies large matrices.
# An explicit setting (or numpy imported before sglperf) wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

__version__ = "0.1.0"
