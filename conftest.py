"""Loads the perf suite's pytest plugin (fixtures/); nothing else."""

pytest_plugins = ["fixtures.plugin"]
