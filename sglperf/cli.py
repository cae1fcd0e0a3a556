"""`sglperf` sub-commands. Each one delegates to the module that does the work."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sim":  # the simulator parses its own SGLang-style flags
        from .sim.server import main as sim_main

        return sim_main(argv[1:])
    parser = argparse.ArgumentParser(prog="sglperf", description="Performance regression suite for LLM serving.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("sim", help="run the SGLang-compatible simulator (sglperf sim --help)")
    sub.add_parser("sim-calibrate", help="check the simulator's seed preset against the seed's table")
    from . import bench

    p = sub.add_parser("bench", help="sweep a running server and print sustained throughput per level")
    bench.add_arguments(p)
    p.set_defaults(func=bench.main)
    args = parser.parse_args(argv)
    if args.command == "sim-calibrate":
        from .sim.calibrate import main as cal_main

        return cal_main([])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
