"""Loads the perf suite's pytest plugin for a checkout that is not installed (installed, pytest loads it through
the `pytest11` entry point `sglperf`); nothing else."""

import sys

pytest_plugins = [] if "fixtures.plugin" in sys.modules else ["fixtures.plugin"]
