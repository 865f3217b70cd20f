"""The ports floor's one-glance index (conformance/ports/README.md) stays true: every module of the floor is in
it, and it names no module the floor lacks (the engines' index: tests/engines/test_engines_layout.py)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLOOR = ROOT / "conformance" / "ports"
INDEX = FLOOR / "README.md"


def test_every_module_of_the_floor_is_indexed_and_every_indexed_module_exists():
    text = INDEX.read_text(encoding="utf-8")
    modules = {p.name for p in FLOOR.glob("*.py") if p.name != "__init__.py"}
    assert {m for m in modules if f"`{m}`" not in text} == set()
    table = text.split("| module |", 1)[1]
    named = set(re.findall(r"`([a-z0-9_]+\.py)`", table))
    assert named - modules == set(), named - modules




def test_no_module_of_the_floor_stands_in_for_an_engine():
    """An engine's glue lives in its folder only (conformance/engines/NAME/): the ports floor holds no module
    named after an engine, which would be a second place for it."""
    engines = {p.name for p in (ROOT / "conformance" / "engines").iterdir() if (p / "engine.py").is_file()}
    assert engines, "no engine folders found"
    assert {p.stem for p in FLOOR.glob("*.py")} & (engines | {"kerashub"}) == set()
