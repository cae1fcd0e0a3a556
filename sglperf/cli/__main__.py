"""`python -m sglperf.cli`: the same as the `sglperf` command."""

import sys

from . import main

sys.exit(main())
