"""The floors of the installed layout (docs/layout.md): every import looks down, never up, never
sideways to a sibling, and no circle of files.

Every module is named as installed (pyproject's ``package-dir`` maps ``reference/`` to
``gdncheck.reference``, ...) and placed on its floor by :data:`FLOORS`; a module no floor names
fails, so a new package must say where it stands. All imports are read, those inside functions
too, relative ones resolved. The float64 reference also never imports torch or triton.
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
                 "gdncheck.portable", "gdncheck.experts", "gdncheck.installed", "gdncheck.untrusted")),
    (1, "reference", ("gdncheck.reference",)),
    (1, "gpu_impl", ("gdncheck.gpu_impl",)),
    (1, "harness", ("gdncheck.harness",)),
    (2, "fixtures", ("gdncheck.fixtures",)),
    (3, "judge", ("gdncheck.conformance", "gdncheck.conformance.judge")),
    (4, "earn", ("gdncheck.conformance.earn",)),
    (5, "ports", ("gdncheck.conformance.ports",)),
    (6, "properties", ("gdncheck.conformance.properties",)),
    (6, "meta", ("gdncheck.conformance.meta",)),
    (7, "reports", ("gdncheck.reports",)),
    (8, "gate", ("gdncheck.gate",)),
    (9, "apps", ("gdncheck.cli", "gdncheck.commands", "gdncheck.bench", "gdncheck.__main__", "gdncheck.testing")),
)
#: Never imported by the float64 reference, at any depth of its own modules.
NOT_IN_REFERENCE = ("torch", "triton", "gdncheck.gpu_impl", "gdncheck.harness")


def package_dirs() -> dict[str, Path]:
    """pyproject's ``package-dir``: installed package name -> folder."""
    text = (ROOT / "pyproject.toml").read_text()
    table = re.search(r"^package-dir\s*=\s*\{(.*)\}\s*$", text, re.M).group(1)
    return {name: ROOT / folder for name, folder in re.findall(r'"([\w.]+)"\s*=\s*"([\w/.-]+)"', table)}


def modules() -> dict[str, Path]:
    """Every module of the installed layout: dotted name -> file."""
    out: dict[str, Path] = {}
    for package, folder in package_dirs().items():
        for path in folder.rglob("*.py"):
            if "__pycache__" in path.parts:
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


def imports(module: str, path: Path, known: set[str]) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import of the file, function-level ones included; ``from X
    import n`` is the module ``X.n`` when that is a module, else ``X``; relative names resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
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
