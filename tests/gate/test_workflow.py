"""The CI workflow parses, has the jobs the README promises, and every gdncheck command line in it
parses with the real command-line parser (a renamed flag fails here, not in CI)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from gdncheck.cli import build_parser

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "conformance.yml"


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _commands(job: dict, values: dict[str, str]) -> list[list[str]]:
    """Every gdncheck invocation of a job's run steps, with ${{ }} expressions substituted."""
    out = []
    for step in job["steps"]:
        script = step.get("run")
        if not script:
            continue
        script = re.sub(r"\$\{\{\s*([^}]+?)\s*\}\}", lambda m: values.get(m.group(1), "X"), script)
        script = script.replace("\\\n", " ")
        for part in re.split(r"\n|&&|\|\|", script):
            argv = shlex.split(part)
            for i, tok in enumerate(argv):
                if tok.endswith("gdncheck") and i + 1 < len(argv):
                    out.append(argv[i + 1:])
    return out


def test_workflow_jobs(workflow):
    on = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as True
    assert "push" in on and "pull_request" in on
    jobs = workflow["jobs"]
    assert jobs["gpu"]["runs-on"] == ["self-hosted", "gpu"]
    assert jobs["gpu"]["strategy"]["matrix"]["shard"] == [0, 1]
    uses = [s.get("uses", "") for j in jobs.values() for s in j["steps"]]
    assert any(u.startswith("EnricoMi/publish-unit-test-result-action@") for u in uses)
    assert any(u.startswith("actions/upload-artifact@") for u in uses)


def test_every_gdncheck_command_parses(workflow):
    parser = build_parser()
    seen = []
    for name, job in workflow["jobs"].items():
        for shard in [str(s) for s in job.get("strategy", {}).get("matrix", {}).get("shard", ["0"])]:
            for argv in _commands(job, {"matrix.shard": shard}):
                try:
                    args = parser.parse_args(argv)
                except SystemExit:
                    pytest.fail(f"job {name}: `gdncheck {' '.join(argv)}` does not parse")
                seen.append((name, argv[0], args))
    assert any(c == "report" for _, c, _ in seen)
    gates = [(n, a) for n, c, a in seen if c == "gate"]
    assert {n for n, _ in gates} == {"cpu", "gpu", "full"}
    gpu = [a for n, a in gates if n == "gpu"]
    assert sorted(a.shard for a in gpu) == ["0/2", "1/2"]
    assert all(a.device == "cuda" and a.junit and a.report for a in gpu)
