"""The floors of the installed layout (docs/layout.md): every import looks down, never up, never
sideways to a sibling, and no circle of files; and the test tree mirrors the floors.

Every module is named as installed (pyproject's ``package-dir`` maps ``reference/`` to
``gdncheck.reference``, ...) and placed on its floor by :data:`FLOORS`; a module no floor names
fails, so a new package must say where it stands. All imports are read, those inside functions
too, relative ones resolved. The float64 reference also never imports torch or triton.

The tests stand on the floors too. A folder ``tests/<folder>/`` tests the unit :data:`TEST_FOLDERS`
names (``tests/judge/`` the judge, ``tests/apps/`` the command line, ...), and every module in it, at
any depth (tests, conftest.py, helpers), imports

- gdncheck modules of its unit's floor and the floors below: its own unit, a sibling on the same
  floor (a test checks one sibling against another: the Triton path against the float64
  reference), the core;
- ``gdncheck.cli`` from any floor (:data:`ANY_FLOOR`): a test drives the code as a user does, through
  the command line's entry (``main``, ``build_parser``), as the gate's, the ports' and other tests
  below the apps floor do; the rest of the apps floor (``gdncheck.commands``, ``gdncheck.bench``)
  only from ``tests/apps/``;
- modules of the test folders of its floor and below (``tests.fixtures.outputs`` from ``tests/judge/``
  on, ``tests.apps.plugins`` from ``tests/apps/`` only); those at the top of ``tests/``
  (``tests.helpers``) and in the free folders (``tests.ci.workflows``) from anywhere.

A test that needs a higher floor belongs to that floor's folder. Folders that test no floor (the CI
files, the wheel, the fuzzer: :data:`FREE_TEST_FOLDERS`) import anything and say why; so do the few
modules at the top of ``tests/`` (:data:`TOP_LEVEL_TESTS`). A folder or a top-level module named in
neither table fails, so a new one says where it stands. Each violation reads
``tests/X/test_y.py:LINE imports gdncheck.Z (floor N) above its floor M (unit U)``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (floor, unit, module prefixes). A unit imports its own modules freely and the units of lower
#: floors; units of one floor are siblings and never import each other.
FLOORS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (0, "core", ("gdncheck", "gdncheck._version", "gdncheck.errors", "gdncheck.config", "gdncheck.stages",
                 "gdncheck.profiles", "gdncheck.dtypes", "gdncheck.safetensors_io", "gdncheck.weights",
                 "gdncheck.checkpoint", "gdncheck.snapshot", "gdncheck.calls", "gdncheck.env", "gdncheck.synthetic",
                 "gdncheck.portable", "gdncheck.experts", "gdncheck.installed", "gdncheck.untrusted",
                 "gdncheck.writes", "gdncheck.sharding", "gdncheck.features")),
    (1, "reference", ("gdncheck.reference",)),
    (1, "gpu_impl", ("gdncheck.gpu_impl",)),
    (1, "harness", ("gdncheck.harness",)),
    (2, "fixtures", ("gdncheck.fixtures",)),
    (2, "gpu_tools", ("gdncheck.gpu_tools",)),
    (3, "judge", ("gdncheck.conformance", "gdncheck.conformance.judge")),
    (4, "earn", ("gdncheck.conformance.earn",)),
    # the ports and the engines are one unit: the built-ins (ports/implementations.py) import the engines' glue,
    # and an engine's registry entry names a built-in (docs/layout.md, "Adding an engine")
    (5, "ports", ("gdncheck.conformance.ports", "gdncheck.conformance.engines")),
    (6, "properties", ("gdncheck.conformance.properties",)),
    (6, "meta", ("gdncheck.conformance.meta",)),
    (7, "reports", ("gdncheck.reports",)),
    (8, "gate", ("gdncheck.gate",)),
    (9, "apps", ("gdncheck.cli", "gdncheck.commands", "gdncheck.bench", "gdncheck.__main__", "gdncheck.testing")),
)
#: Never imported by the float64 reference, at any depth of its own modules.
NOT_IN_REFERENCE = ("torch", "triton", "gdncheck.gpu_impl", "gdncheck.harness")

#: tests/<folder>/ -> the unit of FLOORS its modules test (and whose floor bounds their imports).
TEST_FOLDERS: dict[str, str] = {
    "core": "core", "reference": "reference", "gpu_impl": "gpu_impl", "harness": "harness", "fixtures": "fixtures",
    "gpu_tools": "gpu_tools", "judge": "judge", "earn": "earn", "ports": "ports", "engines": "ports",
    "properties": "properties",
    "meta": "meta", "reports": "reports", "gate": "gate", "apps": "apps",
}
#: Test folders on no floor: they may import anything, for the reason given.
FREE_TEST_FOLDERS: dict[str, str] = {
    "ci": "the workflow files and the bootstrap script (.github/, .ci/), not the package",
    "packaging": "the wheel, the pytest plug-in and the port template as installed: the package as a whole",
    "fuzz": "mutated inputs through the whole command line, end to end",
}
#: Modules at the top of tests/: shared configuration and helpers, and tests of no one floor.
TOP_LEVEL_TESTS: dict[str, str] = {
    "__init__.py": "the package of the tests",
    "conftest.py": "pytest's configuration of every test (profiles, the committed suite's fixtures)",
    "helpers.py": "small helpers every floor's tests share (tiny configs, random inputs, routing margins)",
    "test_layers.py": "this file: the floors of the code and of the tests",
    "test_citations.py": "the citations of the contract documents, in code, docs and tests",
    "test_call_contract.py": "the call contract (gdncheck/calls.py) over every layer: floors 1, 4 and 6 at once",
}
#: What a test of any floor may import: the command line's entry, through which a user drives everything.
ANY_FLOOR = ("gdncheck.cli",)


def package_dirs() -> dict[str, Path]:
    """pyproject's ``package-dir``: installed package name -> folder."""
    text = (ROOT / "pyproject.toml").read_text()
    table = re.search(r"^package-dir\s*=\s*\{(.*)\}\s*$", text, re.M).group(1)
    return {name: ROOT / folder for name, folder in re.findall(r'"([\w.]+)"\s*=\s*"([\w/.-]+)"', table)}


def modules() -> dict[str, Path]:
    """Every module of the installed layout: dotted name -> file. A module is a file of a package (a folder
    with an ``__init__.py``, as setup.py finds them): a script beside it in a folder that is none (an
    engine's ``repros/``, ``node_modules/``) is not installed and is no module."""
    out: dict[str, Path] = {}
    for package, folder in package_dirs().items():
        for path in folder.rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            if any(not (d / "__init__.py").is_file() for d in (path.parent, *path.parent.parents)
                   if d == folder or folder in d.parents):
                continue
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def unit_of(module: str) -> tuple[int, str] | None:
    """(floor, unit) of a gdncheck module: the unit naming the longest prefix of it."""
    best = None
    for floor, unit, prefixes in FLOORS:
        for p in prefixes:
            exact_only = p == "gdncheck"  # the package itself, not everything under it
            if module == p or (not exact_only and module.startswith(p + ".")):
                if best is None or len(p) > best[0]:
                    best = (len(p), floor, unit)
    return None if best is None else (best[1], best[2])


def imports(module: str, path: Path, known: set[str], source: str | None = None) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import of the file (``source``, else the file's text),
    function-level ones included; ``from X import n`` is the module ``X.n`` when that is a module, else
    ``X``; relative names resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    text = path.read_text(encoding="utf-8") if source is None else source
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield (sub if sub in known else base), node.lineno


def graph() -> tuple[dict[str, Path], dict[str, list[tuple[str, int]]]]:
    mods = modules()
    known = set(mods)
    return mods, {m: list(imports(m, p, known)) for m, p in mods.items()}


def floor_of(unit: str) -> int:
    return next(floor for floor, u, _ in FLOORS if u == unit)


def module_problems(path: str | Path, source: str, known: set[str]) -> list[str]:
    """What is wrong with the test module at ``path`` (relative to the repository root: ``tests/...``)
    whose text is ``source``: a folder or top-level module no table names, or each import above the
    floor of the unit its folder tests (the rule of the module docstring)."""
    path = Path(path)
    parts = path.parts
    assert parts[0] == "tests" and path.suffix == ".py", path
    if len(parts) == 2:
        if parts[1] not in TOP_LEVEL_TESTS:
            return [f"{path}: a module at the top of tests/: put it in the folder of the floor it tests "
                    f"(or say why it stands on none in TOP_LEVEL_TESTS)"]
        return []
    folder = parts[1]
    if folder in FREE_TEST_FOLDERS:
        return []
    if folder not in TEST_FOLDERS:
        return [f"tests/{folder}/: a test folder on no floor: name the unit it tests in TEST_FOLDERS (or say why "
                f"it tests none in FREE_TEST_FOLDERS), and in docs/layout.md"]
    unit = TEST_FOLDERS[folder]
    floor = floor_of(unit)
    names = list(path.with_suffix("").parts)
    if names[-1] == "__init__":
        names.pop()
    bad = []
    for target, line in imports(".".join(names), path, known, source):
        top, _, rest = target.partition(".")
        if top == "gdncheck":
            if any(target == a or target.startswith(a + ".") for a in ANY_FLOOR):
                continue
            placed = unit_of(target)
            t_floor = None if placed is None else placed[0]
        elif top == "tests" and rest.split(".")[0] in TEST_FOLDERS:
            t_floor = floor_of(TEST_FOLDERS[rest.split(".")[0]])
        else:
            continue
        if t_floor is not None and t_floor > floor:
            bad.append(f"{path}:{line} imports {target} (floor {t_floor}) above its floor {floor} (unit {unit})")
    return bad


def tree_of_tests() -> dict[Path, str]:
    """Every module of tests/: its path relative to the repository root -> its text."""
    paths = sorted(p for p in (ROOT / "tests").rglob("*.py") if "__pycache__" not in p.parts)
    return {p.relative_to(ROOT): p.read_text(encoding="utf-8") for p in paths}


def names_known(tree: dict[Path, str]) -> set[str]:
    """The dotted names ``from X import n`` may resolve to: the installed modules and those of tests/."""
    dotted = {".".join(p.with_suffix("").parts[:-1] if p.name == "__init__.py" else p.with_suffix("").parts)
              for p in tree}
    return set(modules()) | dotted


def test_every_module_stands_on_a_floor():
    mods = modules()
    assert {"gdncheck.harness.program", "gdncheck.reference.layer", "gdncheck.gate.run",
            "gdncheck.conformance.judge.verify"} <= set(mods)  # pyproject's map is read
    unplaced = sorted(m for m in mods if unit_of(m) is None)
    assert not unplaced, f"modules on no floor (add them to FLOORS and docs/layout.md): {unplaced}"


def test_imports_only_look_down():
    mods, edges = graph()
    bad = []
    for module, targets in edges.items():
        floor, unit = unit_of(module)
        for target, line in targets:
            if not (target == "gdncheck" or target.startswith("gdncheck.")) or target not in mods:
                continue
            t_floor, t_unit = unit_of(target)
            where = f"{mods[module].relative_to(ROOT)}:{line}: {module} ({unit}, floor {floor}) imports {target} " \
                    f"({t_unit}, floor {t_floor})"
            if t_floor > floor:
                bad.append(f"{where}: up a floor")
            elif t_floor == floor and t_unit != unit:
                bad.append(f"{where}: a sibling on the same floor")
    assert not bad, "\n".join(bad)


def test_no_circle_of_files():
    mods, edges = graph()
    succ = {m: sorted({t for t, _ in edges[m] if t in mods and t != m}) for m in mods}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for m in sorted(mods):
        if m not in index:
            visit(m)
    assert not circles, "circles of imports: " + "; ".join(" <-> ".join(c) for c in circles)


def test_the_reference_imports_no_torch_triton_gpu_impl_or_harness():
    mods, edges = graph()
    bad = [f"{mods[m].relative_to(ROOT)}:{line}: imports {t}" for m, targets in edges.items()
           if unit_of(m) == (1, "reference") for t, line in targets
           if any(t == n or t.startswith(n + ".") for n in NOT_IN_REFERENCE)]
    assert not bad, "\n".join(bad)


def test_the_checks_see_a_bad_import(tmp_path):
    """The resolver reads relative and function-level imports (what the tests above rely on)."""
    src = tmp_path / "judge.py"
    src.write_text("from ..ports import run\n\ndef f():\n    from . import verdicts\n    import torch\n")
    known = {"gdncheck.conformance.ports.run", "gdncheck.conformance.judge.verdicts"}
    found = [t for t, _ in imports("gdncheck.conformance.judge.case", src, known)]
    assert found == ["gdncheck.conformance.ports.run", "gdncheck.conformance.judge.verdicts", "torch"]
    assert unit_of("gdncheck.conformance.ports.run") == (5, "ports") and unit_of("gdncheck.synthetic") == (0, "core")
    assert unit_of("gdncheck.conformance.judge.case") == (3, "judge") and unit_of("gdncheck.new_module") is None


def test_the_test_folders_name_units_of_the_floors():
    units = {unit for _, unit, _ in FLOORS}
    assert set(TEST_FOLDERS.values()) <= units, set(TEST_FOLDERS.values()) - units
    assert not set(TEST_FOLDERS) & set(FREE_TEST_FOLDERS)
    assert set(ANY_FLOOR) <= set(modules()) and all(unit_of(m) == (9, "apps") for m in ANY_FLOOR)


def test_the_tests_stand_on_the_floors_they_test():
    """Each test folder is named in a table, and each module in it imports nothing above its floor."""
    found = tree_of_tests()
    known = names_known(found)
    assert Path("tests/judge/test_metrics.py") in found and Path("tests/test_layers.py") in found
    bad = sorted({problem for path, source in found.items() for problem in module_problems(path, source, known)})
    assert not bad, "\n".join(bad)


def test_the_test_check_sees_a_test_above_its_floor():
    """The rule fails on a module placed on the wrong floor, on a folder no table names, and on a new
    top-level module; it lets a test import its own floor, a sibling, the floors below and the CLI's entry."""
    known = names_known(tree_of_tests())

    def check(path: str, source: str) -> list[str]:
        return module_problems(path, source, known)

    assert check("tests/core/test_fake.py", "import gdncheck.gate\n") == [
        "tests/core/test_fake.py:1 imports gdncheck.gate (floor 8) above its floor 0 (unit core)"]
    late = "import numpy\n\ndef f():\n    from gdncheck.conformance.meta import mutants\n"  # inside a function
    assert check("tests/ports/test_fake.py", late) == [
        "tests/ports/test_fake.py:4 imports gdncheck.conformance.meta.mutants (floor 6) above its floor 5 (unit ports)"]
    assert check("tests/core/test_fake.py", "from gdncheck.commands import demo\n") == [
        "tests/core/test_fake.py:1 imports gdncheck.commands.demo (floor 9) above its floor 0 (unit core)"]
    assert check("tests/judge/test_fake.py", "from tests.apps.plugins import FORGED\n") == [
        "tests/judge/test_fake.py:1 imports tests.apps.plugins (floor 9) above its floor 3 (unit judge)"]
    assert check("tests/earn/conftest.py", "from gdncheck.conformance.ports.run import run_impl\n") == [
        "tests/earn/conftest.py:1 imports gdncheck.conformance.ports.run (floor 5) above its floor 4 (unit earn)"]
    # its own floor, a sibling, the floors below, the CLI's entry, lower test folders' helpers: all fine
    fine = ("from gdncheck.cli import main\nfrom gdncheck import errors\nimport gdncheck.gpu_impl\n"
            "from gdncheck.reference import Layer\nimport gdncheck.harness\nfrom tests.helpers import tiny_config\n"
            "from tests.reference.naive_layer import naive_layer\nfrom . import compare\n")
    assert check("tests/gpu_impl/test_fake.py", fine) == []
    assert check("tests/reports/sub/test_fake.py", "from ...fixtures.outputs import perfect_outputs\n") == []
    assert check("tests/reports/sub/test_fake.py", "from ...apps import plugins\n") == [
        "tests/reports/sub/test_fake.py:1 imports tests.apps.plugins (floor 9) above its floor 7 (unit reports)"]
    assert check("tests/ci/test_fake.py", "import gdncheck.gate\n") == []  # a free folder
    # a folder no table names, and a module at the top no table names
    (folder,) = check("tests/new_unit/test_fake.py", "import numpy\n")
    assert folder.startswith("tests/new_unit/: a test folder on no floor")
    (top,) = check("tests/test_fake.py", "import numpy\n")
    assert top.startswith("tests/test_fake.py: a module at the top of tests/")
    assert check("tests/test_layers.py", "import gdncheck.gate\n") == []
