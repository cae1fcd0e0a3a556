"""The package's wings import only downwards, and nothing imports in a circle (docs/design.md): read from every
module's source with ast, lazy imports inside functions included, so a newcomer's shortcut fails here and not in
review. Code, profiles and user-facing messages say rules, not dated one-machine stories (those live in docs/)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import sglperf

ROOT = Path(sglperf.__file__).resolve().parent
REPO = ROOT.parent

# The floor of each top-level part of the package, from the ground up: a module may import its own floor and the
# ones below. decide/ sits beside report/, under run/: a claim is settled without the run or pytest.
LAYERS = {
    **dict.fromkeys(("records", "categories", "fileio", "redact", "interrupts", "argtypes", "data"), 0),
    **dict.fromkeys(("environment", "engines", "measure"), 1),
    "store": 2,
    "judge": 3,
    **dict.fromkeys(("report", "decide"), 4),
    "run": 5,
    "cli": 6, "__main__": 7, "__init__": 0,
}
# Within a floor, what a wing must not reach (the design's rules; the rest of a floor may lean on each other).
FORBIDDEN = {
    "engines": {"measure"},
    "environment": {"engines", "measure"},
    "decide": {"report"},
}
# Outside packages a floor must not import: the pytest layer is fixtures/, above everything here.
FORBIDDEN_PACKAGES = {part: {"pytest", "_pytest"} for part in LAYERS}


def part_of(module: str) -> str:
    """'sglperf.measure.client' -> 'measure'; 'sglperf' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(path: Path, module: str, *, outside: bool = False) -> list[tuple[int, str]]:
    """(line, imported sglperf module) for every import in the file, relative ones resolved; with `outside`, the
    top-level names of the other packages it imports instead."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
            out += [(node.lineno, n) for n in names if (n.split(".")[0] == "sglperf") != outside]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if (target.split(".")[0] != "sglperf") != outside:
                continue
            if outside:
                out.append((node.lineno, target.split(".")[0]))
            elif target == "sglperf" or _is_package(target):  # `from .. import x`: a module, or a name of the package
                out += [(node.lineno, f"{target}.{a.name}" if _is_module(f"{target}.{a.name}") else target)
                        for a in node.names]
            else:
                out.append((node.lineno, target))
    return out


def _file_of(module: str) -> Path:
    return REPO.joinpath(*module.split("."))


def _is_package(module: str) -> bool:
    return _file_of(module).is_dir()


def _is_module(module: str) -> bool:
    f = _file_of(module)
    return f.is_dir() or f.with_suffix(".py").is_file()


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
            problems.append(f"{path}:{line}: {mine} (floor {LAYERS.get(mine)}) imports {target} "
                            f"(floor {LAYERS.get(theirs)})")
    for line, package in imports_of(path, module, outside=True):
        if package in FORBIDDEN_PACKAGES.get(mine, ()):
            problems.append(f"{path}:{line}: {mine} imports {package} (only fixtures/ knows pytest)")
    return problems


def modules(root: Path = ROOT):
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield path, ".".join(parts)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan): every import cycle, each once."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path, mod in modules(root):
        graph[mod] = {t for _, t in imports_of(path, mod) if t != mod and _is_module(t) and not _is_package(t)}
    return graph


def test_every_import_goes_down_a_floor_or_stays_in_its_own():
    problems = [p for path, mod in modules() for p in upward_imports(path, mod)]
    assert not problems, "\n".join(problems)


def test_no_module_imports_in_a_circle():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_a_planted_cycle_is_found():
    graph = {"sglperf.judge.floor": {"sglperf.store.baselines"}, "sglperf.store.baselines": {"sglperf.store.rundoc"},
             "sglperf.store.rundoc": {"sglperf.judge.floor"}, "sglperf.records": set()}
    assert cycles(graph) == [["sglperf.judge.floor", "sglperf.store.baselines", "sglperf.store.rundoc"]]


def test_every_part_of_the_package_has_a_floor():
    parts = {part_of(mod) for _, mod in modules()}
    assert parts - set(LAYERS) - {"sim"} == set()


def test_a_planted_upward_import_is_found(tmp_path):
    planted = {
        "measure/level.py": "from ..judge.floor import check_floor\n",
        "engines/base.py": "def f():\n    from ..judge import latency\n",
        "store/history.py": "from sglperf.report import drift\n",
        "store/baselines.py": "from ..judge.noise import of\n",
        "decide/floor.py": "from ..run import session\n",
        "judge/count.py": "import pytest\n",
        "environment/gpu.py": "from ..run import session\n",
        "sim/engine.py": "from ..measure import client\n",
    }
    for rel, source in planted.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        module = "sglperf." + rel[:-3].replace("/", ".")
        assert upward_imports(path, module), f"the planted import in {rel} was not found"


def test_the_load_generator_loads_nothing_of_the_judge_the_store_or_the_report():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import sys, sglperf.measure.client; print(' '.join(sorted(m for m "
                          "in sys.modules if m.startswith('sglperf'))))"], capture_output=True, text=True, check=True)
    loaded = out.stdout.split()
    assert "sglperf.measure.client" in loaded
    assert not [m for m in loaded if part_of(m) in ("judge", "store", "report", "engines", "run", "decide")], loaded


# A date (2026-12-01, 12-04) or a lent machine's name in code is a story about one host on one day: the rule it
# led to belongs in the code, the story in docs/measurement.md.
STORY = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b\d\d-\d\d\)|\bH[12]00\b|\bEPYC\b|\bXeon\b|\b2 cores\b|\b2-core\b",
                   re.IGNORECASE)
STORY_PLACES = ("sglperf", "fixtures", "perf_tests", "profiles")


def stories(root: Path = REPO) -> list[str]:
    """Lines of code, profiles and messages that tell a dated or one-machine story (the simulator's presets name
    the hardware they model, and the data files quote real answers: both are facts, not stories)."""
    found = []
    for place in STORY_PLACES:
        for path in sorted((root / place).rglob("*")):
            if path.suffix not in (".py", ".toml") or "sim" in path.relative_to(root).parts[1:2]:
                continue
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if STORY.search(line):
                    found.append(f"{path.relative_to(root)}:{i}: {line.strip()[:100]}")
    return found


def test_code_profiles_and_messages_tell_no_dated_one_machine_stories():
    found = stories()
    assert not found, f"{len(found)} lines (their story goes to docs/measurement.md):\n" + "\n".join(found)


def test_a_planted_story_is_found(tmp_path):
    (tmp_path / "sglperf").mkdir()
    (tmp_path / "sglperf" / "x.py").write_text("# on a 2-core Intel Xeon VM (2026-12-03) c8 read ±30%\n")
    assert stories(tmp_path)


def test_the_pytest_layer_installs_under_a_name_of_its_own_and_the_entry_point_keeps_its_name():
    """fixtures/ stays where the design card puts it, installed as sglperf_pytest: a top-level `fixtures` package
    would clash with a well-known one on the package index. The pytest11 entry point is still `sglperf`."""
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["pytest11"] == {"sglperf": "sglperf_pytest.plugin"}
    tool = project["tool"]["setuptools"]
    assert tool["package-dir"] == {"sglperf_pytest": "fixtures"} and "fixtures" not in tool["packages"]
    assert {p for p in tool["packages"] if p.startswith("sglperf.")} == {
        f"sglperf.{d.name}" for d in ROOT.iterdir() if (d / "__init__.py").exists()}
