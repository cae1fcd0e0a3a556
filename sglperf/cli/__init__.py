"""`sglperf` sub-commands. Each one delegates to the module that does the work."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "llamacpp":
        from ..engines.llamacpp_build import main as llamacpp_main

        return llamacpp_main(argv[1:])
    if argv and argv[0] == "sglang":
        from ..engines.sglang_cpu import main as sglang_main

        return sglang_main(argv[1:])
    if argv and argv[0] == "sim":  # the simulator parses its own SGLang-style flags
        from ..sim.server import main as sim_main

        return sim_main(argv[1:])
    parser = argparse.ArgumentParser(prog="sglperf", description="Performance regression suite for LLM serving.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("sim", help="run the SGLang-compatible simulator (sglperf sim --help)")
    sub.add_parser("sim-calibrate", help="check the simulator's seed preset against the seed's table")
    sub.add_parser("llamacpp", help="build llama-server / make the tiny model (sglperf llamacpp build|model|paths)")
    sub.add_parser("sglang", help="real SGLang on the CPU for the tests (sglperf sglang prepare --cpu | paths)")
    from ..report import drift, html
    from . import baseline, bench, compare, export, history, replay

    for name, module, help_ in (
            ("bench", bench, "sweep a running server and print sustained throughput per level"),
            ("report", html, "generate the Allure HTML report offline (pinned npm allure)"),
            ("baseline", baseline, "show, update or calibrate baselines"),
            ("compare", compare, "is run B slower than run A: per level, with intervals and what changed"),
            ("replay", replay, "send a Mooncake-layout trace on its timestamps and say how late and how cached"),
            ("export", export, "run files as reports other tools read (--format llm-d)"),
            ("drift", drift, "change points in the run history, with the environment changes there"),
            ("history", history, "the fleet's results database: import, push, ls, migrate")):
        p = sub.add_parser(name, help=help_)
        module.add_arguments(p)
        p.set_defaults(func=module.main)
    p = sub.add_parser("launch-cmd", help="print {config: argv} of a profile as JSON")
    p.add_argument("--profile", required=True)
    p.add_argument("--model-path", default=None)
    p.set_defaults(func=launch_cmd)
    p = sub.add_parser("profile-keys", help="print the profiles' [measurement] keys as a Markdown table")
    p.set_defaults(func=profile_keys)
    args = parser.parse_args(argv)
    if args.command == "sim-calibrate":
        from ..sim.calibrate import main as cal_main

        return cal_main([])
    return args.func(args)


def profile_keys(args) -> int:
    from ..run import profiles

    print(profiles.knob_table())
    return 0


def launch_cmd(args) -> int:
    import json

    from ..run import profiles

    try:
        prof = profiles.load(args.profile)
    except profiles.ProfileError as e:
        print(f"sglperf launch-cmd: {e}", file=sys.stderr)
        return 2
    out = {c.name: prof.launch_argv(c.name, model_path=args.model_path) for c in prof.configs}
    print(json.dumps(out, indent=2))
    for c in prof.configs:
        check = prof.adapter().check_flags(prof.launch_argv(c.name, model_path=args.model_path, resolve=False))
        for problem in check.problems:
            print(f"warning: {c.name}: {problem} (checked with {check.source})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
