"""Loads the perf suite's pytest plugin for a checkout that is not installed (installed, pytest loads it through
the `pytest11` entry point `sglperf`); nothing else."""

import sys

# installed, the entry point has loaded it as sglperf_pytest.plugin before this file is read
pytest_plugins = [] if {"sglperf_pytest.plugin", "fixtures.plugin"} & set(sys.modules) else ["fixtures.plugin"]
