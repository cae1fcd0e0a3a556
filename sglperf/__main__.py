"""`python -m sglperf`: the `sglperf` command where no console script is installed (an offline host whose
packages travel as a PYTHONPATH, ci/gpu-proof.sh)."""

import sys

from .cli import main

sys.exit(main())
