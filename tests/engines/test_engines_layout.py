"""Each engine in one place (docs/layout.md, "Adding an engine"): the registry is its folders, found in the
order registry.ORDER gives (the matrix's rows, docs/engines.md's table); each folder holds its entry and
findings (engine.py), its page, its glue and repros, and its tests mirror it; the engines' index
(conformance/engines/README.md) has a row per engine whose every path exists. A folder left out of ORDER, an
engine registered under another folder's name, a finding named twice, an index row whose page or test was
renamed: each fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gdncheck.conformance.engines import registry
from gdncheck.conformance.engines.schema import Engine, Finding
from gdncheck.errors import GDNError

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ROOT / "conformance" / "engines"
INDEX = ENGINES / "README.md"


def _engine_rows() -> dict[str, list[str]]:
    rows = {}
    for line in INDEX.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\| `([a-z0-9_-]+)` \| (.*) \|$", line)
        if m and m.group(1) in registry.ENGINES:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split(" | ")]
    return rows


def test_the_registry_is_every_folder_in_the_order_of_order():
    folders = sorted(p.name for p in ENGINES.iterdir() if (p / "engine.py").is_file())
    assert sorted(registry.ORDER) == folders  # a folder without its line of ORDER (or a line without a folder)
    assert [n.replace("-", "_") for n in registry.ENGINES] == list(registry.ORDER)
    # the order of docs/engines.md's first table (what the matrix writes): the baseline, then each engine
    table = (ROOT / "docs" / "engines.md").read_text(encoding="utf-8").split("| engine | what runs |", 1)[1]
    listed = re.findall(r"^\| `([a-z0-9-]+)` \|", table.split("\n\n", 1)[0], re.M)
    assert sorted(listed) == sorted(registry.ENGINES)
    assert registry.ENGINES["reference"].baseline and list(registry.ENGINES)[0] == "reference"


def test_a_new_folder_is_found_after_the_ordered_ones(tmp_path, monkeypatch):
    for name in ("zeta", "hf", "alpha", "no_engine"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
        if name != "no_engine":
            (tmp_path / name / "engine.py").write_text("")
    monkeypatch.setattr(registry, "HERE", tmp_path)
    assert registry.folders() == ["hf", "alpha", "zeta"]


def _with(monkeypatch, entries):
    monkeypatch.setattr(registry, "folders", lambda: [folder for folder, _, _ in entries])
    monkeypatch.setattr(registry, "_load", lambda folder: next((e, f) for d, e, f in entries if d == folder))


def _engine(name):
    return Engine(name=name, impl=name, judged="fused", profiles=("f32",), modules=(), packages=(), install=None,
                  about="a test engine")


def test_a_finding_named_twice_or_without_a_case_is_refused(monkeypatch):
    f = Finding(case="x-", profile="f32", cls="deviation", explanation="e")
    _with(monkeypatch, [("one", _engine("one"), (f, f))])
    with pytest.raises(GDNError, match=r"name a case id prefix and profile once, found \['one', 'x-', 'f32'\] twice"):
        registry._discover()
    _with(monkeypatch, [("one", _engine("one"), (Finding(cls="deviation", explanation="e"),))])
    with pytest.raises(GDNError, match="to name a case id prefix"):
        registry._discover()


def test_an_engine_named_otherwise_than_its_folder_is_refused(monkeypatch):
    _with(monkeypatch, [("one", _engine("two"), ())])
    with pytest.raises(GDNError, match=r"engines/one/engine.py to register the engine 'one' once, found 'two'"):
        registry._discover()
    _with(monkeypatch, [("vllm_triton", _engine("vllm-triton"), ())])
    engines, findings = registry._discover()
    assert list(engines) == ["vllm-triton"] and findings == {}


def test_every_folder_holds_its_entry_page_and_glue_and_its_tests_mirror_it():
    for name, eng in registry.ENGINES.items():
        folder = ENGINES / name.replace("-", "_")
        assert (folder / "__init__.py").is_file() and (folder / "README.md").is_file(), name
        if eng.command is None and eng.impl != "reference":
            assert (folder / "adapter.py").is_file(), name
        if not eng.baseline:
            assert any((ROOT / "tests" / "engines" / folder.name).glob("test_*.py")), name
        for f in (f for (e, _, _), f in registry.FINDINGS.items() if e == name and f.repro):
            assert Path(f.repro).parent == (folder / "repros").relative_to(ROOT), (name, f.repro)


def test_every_registry_engine_has_one_row_with_its_mode_and_profiles():
    rows = _engine_rows()
    assert list(rows) == list(registry.ENGINES), set(registry.ENGINES) ^ set(rows)
    for name, (_, judged, profiles, *_rest) in rows.items():
        engine = registry.ENGINES[name]
        assert judged.replace("-", "_").replace(" ", "_") == engine.judged, (name, judged, engine.judged)
        assert [p.strip() for p in profiles.split(",")] == list(engine.profiles), (name, profiles)


def test_every_path_a_row_names_exists():
    for name, (glue, _, _, page, tests, repros) in _engine_rows().items():
        folder = ENGINES / name.replace("-", "_")
        for module in re.findall(r"`([a-z0-9_/]+\.(?:py|js)|[a-z]+/)`", glue):
            assert (folder / module).exists(), (name, module)
        for path in re.findall(r"((?:conformance|docs|tests)/[\w/.-]+)", " ".join((glue, page, tests))):
            assert (ROOT / path.rstrip(".")).exists(), (name, path)
        for repro in [] if repros == "-" else [r.strip() for r in repros.split(",")]:
            assert (folder / "repros" / repro).is_file(), (name, repro)


def test_every_repro_has_its_row_and_every_fallback_is_its_folders_adapter():
    repros = {p.name for p in ENGINES.glob("*/repros/*.py")}
    listed = {r.strip() for cells in _engine_rows().values() if cells[5] != "-" for r in cells[5].split(",")}
    assert repros == listed, repros ^ listed
    for name, engine in registry.ENGINES.items():
        if engine.fallback:
            assert engine.fallback == f"gdncheck.conformance.engines.{name.replace('-', '_')}.adapter:{engine.impl}", \
                (name, engine.fallback)
