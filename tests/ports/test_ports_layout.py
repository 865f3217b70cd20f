"""The ports floor's one-glance index (conformance/ports/README.md, issue 35 item 5) stays true: every
module of the floor is in it, every engine of the registry has its row, and every path a row names
exists. A new adapter that is not indexed, or an index row whose docs page or test was renamed, fails."""

from __future__ import annotations

import re
from pathlib import Path

from gdncheck.conformance.ports import engines as registry

ROOT = Path(__file__).resolve().parents[2]
FLOOR = ROOT / "conformance" / "ports"
INDEX = FLOOR / "README.md"


def _engine_rows() -> dict[str, list[str]]:
    rows = {}
    for line in INDEX.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\| `([a-z0-9_-]+)` \| (.*) \|$", line)
        if m and m.group(1) in registry.ENGINES:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split(" | ")]
    return rows


def test_every_registry_engine_has_one_row_with_its_mode_and_profiles():
    rows = _engine_rows()
    assert set(rows) == set(registry.ENGINES), set(registry.ENGINES) ^ set(rows)
    for name, (_, judged, profiles, *_rest) in rows.items():
        engine = registry.ENGINES[name]
        assert judged.replace("-", "_").replace(" ", "_") == engine.judged, (name, judged, engine.judged)
        assert [p.strip() for p in profiles.split(",")] == list(engine.profiles), (name, profiles)


def test_every_path_a_row_names_exists():
    for name, (adapter, _, _, docs, tests, repros) in _engine_rows().items():
        for module in re.findall(r"`([a-z0-9_]+\.py)`", adapter):
            assert (FLOOR / module).is_file(), (name, module)
        for path in re.findall(r"(examples/[\w/.-]+|docs/[\w/.-]+|tests/[\w/.-]+)", " ".join((adapter, docs, tests))):
            assert (ROOT / path.rstrip(".")).exists(), (name, path)
        for repro in [] if repros == "-" else [r.strip() for r in repros.split(",")]:
            assert (ROOT / "examples" / "engines" / "repros" / repro).is_file(), (name, repro)


def test_every_module_of_the_floor_is_indexed_and_every_repro_has_an_engine():
    text = INDEX.read_text(encoding="utf-8")
    modules = {p.name for p in FLOOR.glob("*.py") if p.name != "__init__.py"}
    assert {m for m in modules if f"`{m}`" not in text} == set()
    repros = {p.name for p in (ROOT / "examples" / "engines" / "repros").glob("*.py")}
    listed = {r.strip() for cells in _engine_rows().values() if cells[5] != "-" for r in cells[5].split(",")}
    assert repros == listed, repros ^ listed
    # each registry fallback is a module of this floor, named in its engine's row
    for name, engine in registry.ENGINES.items():
        if engine.fallback:
            module = engine.fallback.split(":")[0].rsplit(".", 1)[1] + ".py"
            assert f"`{module}`" in _engine_rows()[name][0], (name, module)
