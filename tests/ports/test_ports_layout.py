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


def test_the_one_line_modules_are_the_adapters_of_engine_folders():
    """Each module the index calls one line re-exports its engine folder's adapter and nothing else."""
    row = next(line for line in INDEX.read_text(encoding="utf-8").splitlines() if "one line each" in line)
    for module in re.findall(r"`([a-z0-9_]+\.py)`", row.split(" | ")[0]):
        code = [line for line in (FLOOR / module).read_text().splitlines()
                if line.strip() and not line.startswith(('"""', "#")) and "conformance/engines" not in line]
        assert len(code) == 1 and code[0].startswith("from gdncheck.conformance.engines.") \
            and ".adapter import " in code[0], (module, code)
