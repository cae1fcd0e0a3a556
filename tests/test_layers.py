"""The package's wings import only downwards (docs/design.md): read from every module's source with ast, lazy
imports inside functions included, so a newcomer's shortcut fails here and not in review."""

from __future__ import annotations

import ast
from pathlib import Path

import sglperf

ROOT = Path(sglperf.__file__).resolve().parent

# The layer of each top-level part of the package: a module may import its own layer and the ones below.
LAYERS = {
    **dict.fromkeys(("records", "categories", "fileio", "redact", "interrupts", "data"), 0),
    **dict.fromkeys(("environment", "engines"), 1),
    **dict.fromkeys(("measure", "judge", "record", "report"), 2),
    **dict.fromkeys(("profiles", "launch", "suite"), 3),
    "cli": 4, "__main__": 5, "__init__": 0,
}
# Within a layer, what a wing must not reach (the design's rules; the rest of a layer may lean on each other).
FORBIDDEN = {
    "measure": {"judge", "record", "report"},
    "engines": {"judge", "measure", "record", "report"},
    "environment": {"engines"},
    "record": {"report"},
}


def part_of(module: str) -> str:
    """'sglperf.measure.client' -> 'measure'; 'sglperf' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported sglperf module) for every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "sglperf"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "sglperf":
                continue
            if target == "sglperf":  # `from .. import x`: a part of the package, or a name of its __init__
                out += [(node.lineno, f"sglperf.{a.name}" if _is_part(a.name) else "sglperf") for a in node.names]
            else:
                out.append((node.lineno, target))
    return out


def _is_part(name: str) -> bool:
    return (ROOT / name).is_dir() or (ROOT / f"{name}.py").is_file()


def upward_imports(path: Path, module: str) -> list[str]:
    mine = part_of(module)
    problems = []
    for line, target in imports_of(path, module):
        theirs = part_of(target)
        if mine == "sim":
            if theirs != "sim":
                problems.append(f"{path}:{line}: the simulator imports {target} (sim/ imports nothing of the suite)")
            continue
        if theirs == "sim" or theirs == mine:
            continue
        if theirs in FORBIDDEN.get(mine, ()):
            problems.append(f"{path}:{line}: {mine} imports {target}")
        elif LAYERS.get(theirs, 99) > LAYERS.get(mine, -1):
            problems.append(f"{path}:{line}: {mine} (layer {LAYERS.get(mine)}) imports {target} "
                            f"(layer {LAYERS.get(theirs)})")
    return problems


def modules():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield path, ".".join(parts)


def test_every_import_goes_down_a_layer_or_stays_in_its_own():
    problems = [p for path, mod in modules() for p in upward_imports(path, mod)]
    assert not problems, "\n".join(problems)


def test_every_part_of_the_package_has_a_layer():
    parts = {part_of(mod) for _, mod in modules()}
    assert parts - set(LAYERS) - {"sim"} == set()


def test_a_planted_upward_import_is_found(tmp_path):
    planted = {
        "measure/level.py": "from ..judge.verdict import check_floor\n",
        "engines/base.py": "def f():\n    from ..judge import latency\n",
        "store/history.py": "from sglperf.report import drift\n",
        "environment/gpu.py": "from .. import suite\n",
        "sim/engine.py": "from ..measure import client\n",
    }
    for rel, source in planted.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        module = "sglperf." + rel[:-3].replace("/", ".")
        assert upward_imports(path, module), f"the planted import in {rel} was not found"


def test_the_load_generator_loads_nothing_of_the_judge_the_record_or_the_report():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import sys, sglperf.measure.client; print(' '.join(sorted(m for m "
                          "in sys.modules if m.startswith('sglperf'))))"], capture_output=True, text=True, check=True)
    loaded = out.stdout.split()
    assert "sglperf.measure.client" in loaded
    assert not [m for m in loaded if part_of(m) in ("judge", "record", "report", "engines", "suite")], loaded
