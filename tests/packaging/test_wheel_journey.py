"""The wheel a pip user installs: built (sdist, then the wheel from it), compared with the source
tree module by module, then installed into a clean virtual environment with no source tree, where
scripts/wheel_journey runs the README's "In a port's own repository" commands."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.test_layers import modules

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "wheel_journey"


def journey_module():
    loader = importlib.machinery.SourceFileLoader("wheel_journey", str(SCRIPT))
    spec = importlib.util.spec_from_loader("wheel_journey", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def readme_block() -> list[str]:
    """The commands of the README's "In a port's own repository" block, comments and pip stripped."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("### In a port's own repository", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    lines = [line.split("  #", 1)[0].strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith(("#", "pip "))]


def test_readme_section_is_the_journey():
    assert readme_block() == journey_module().JOURNEY


@pytest.mark.slow
def test_wheel_journey(tmp_path):
    pytest.importorskip("build", reason="the dev extra's `build` (scripts/bootstrap installs it)")
    figures = tmp_path / "journey.json"
    out = subprocess.run([sys.executable, str(SCRIPT), "--deps", "reuse", "--no-isolation", "--keep",
                          str(tmp_path / "j"), "--json", str(figures)], capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    doc = json.loads(figures.read_text())
    wheel = next((tmp_path / "j" / "dist").glob("*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    # every module of the source tree, as installed (pyproject's package-dir), is in the wheel, and no other
    expected = {str(Path(*name.split(".")).with_suffix(".py")) if path.name != "__init__.py"
                else str(Path(*name.split("."), "__init__.py")) for name, path in modules().items()}
    assert {n for n in names if n.endswith(".py")} == expected
    # the committed suite, byte for byte, and the data files the code reads
    manifest = json.loads((ROOT / "fixtures" / "default" / "manifest.json").read_text())
    with zipfile.ZipFile(wheel) as z:
        for case in manifest["cases"]:
            assert z.read(f"gdncheck/fixtures/default/{case['file']}") == (ROOT / "fixtures" / "default" /
                                                                             case["file"]).read_bytes()
        meta = z.read(f"gdncheck-{doc['version'].split()[-1]}.dist-info/METADATA").decode()
        entry_points = z.read(f"gdncheck-{doc['version'].split()[-1]}.dist-info/entry_points.txt").decode()
    for data in ("gdncheck/conformance/judge/tolerances.json", "gdncheck/fixtures/manifest.schema.json",
                 "gdncheck/gate/gate_summary.schema.json", "gdncheck/reports/templates/index.html.j2",
                 "gdncheck/fixtures/FORMAT.md"):
        assert data in names
    assert "License-Expression: Apache-2.0" in meta and "License-File: LICENSE" in meta
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "gdncheck = gdncheck.testing.plugin" in entry_points and "gdncheck = gdncheck.cli:main" in entry_points
    # what the journey saw: the packaged suite, a conforming verify, every case through the plugin
    assert [s["command"] for s in doc["steps"]] == journey_module().JOURNEY
    assert "/site-packages/gdncheck/fixtures/default" in doc["fixtures"]
    # a plain port has no sharded methods: the sharded cases are not applicable to it (skipped)
    sharded = sum("sharded" in c["tags"] for c in manifest["cases"])
    assert doc["steps"][-1]["last_line"].startswith(f"{len(manifest['cases']) - sharded} passed, {sharded} skipped")


def test_ci_runs_the_journey_on_every_push():
    import yaml

    doc = yaml.safe_load((ROOT / ".github" / "workflows" / "conformance.yml").read_text())
    on = doc.get("on", doc.get(True))
    assert "push" in on and "pull_request" in on
    runs = [step.get("run", "") for job in doc["jobs"].values() for step in job["steps"]]
    assert any(r.startswith("python scripts/wheel_journey --deps install") for r in runs)
