"""The CI workflows have the jobs the README promises, and every gdncheck command line in them
parses with the real command-line parser (a renamed flag fails here, not in CI). Their safety rules
(triggers, permissions, concurrency, caches, actionlint) are tests/ci/test_workflows.py."""

from __future__ import annotations

import re
import shlex

import pytest

from gdncheck.cli import build_parser
from tests.ci import workflows as wf


@pytest.fixture(scope="module")
def workflows() -> dict[str, dict]:
    return wf.load_all()


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


def test_workflow_jobs(workflows):
    assert set(workflows) == {"conformance.yml", "gpu.yml", "publish.yml"}
    cpu = workflows["conformance.yml"]
    assert {"push", "pull_request"} <= set(wf.triggers(cpu)) and cpu["jobs"]["cpu"]["runs-on"] == "ubuntu-latest"
    gpu = workflows["gpu.yml"]["jobs"]
    assert gpu["gpu"]["runs-on"] == gpu["full"]["runs-on"] == ["self-hosted", "gpu"]
    assert gpu["gpu"]["strategy"]["matrix"]["shard"] == [0, 1]
    uses = [wf.uses(s) for w in workflows.values() for j in w["jobs"].values() for s in j["steps"]]
    assert "EnricoMi/publish-unit-test-result-action" in uses
    assert "actions/upload-artifact" in uses


def test_every_gdncheck_command_parses(workflows):
    parser = build_parser()
    seen = []
    for fname, w in workflows.items():
        for name, job in w["jobs"].items():
            for shard in [str(s) for s in job.get("strategy", {}).get("matrix", {}).get("shard", ["0"])]:
                for argv in _commands(job, {"matrix.shard": shard}):
                    try:
                        args = parser.parse_args(argv)
                    except SystemExit:
                        pytest.fail(f"{fname}: job {name}: `gdncheck {' '.join(argv)}` does not parse")
                    seen.append((name, argv[0], args))
    assert any(c == "report" for _, c, _ in seen)
    gates = [(n, a) for n, c, a in seen if c == "gate"]
    assert {n for n, _ in gates} == {"cpu", "gpu", "full", "merge"}
    gpu = [a for n, a in gates if n == "gpu"]
    assert sorted(a.shard for a in gpu) == ["0/2", "1/2"]
    # the merge job takes every shard's gate folder, as the matrix uploads it (artifact gate-gpu-I, --out gate-out)
    merge = next(a for n, a in gates if n == "merge")
    expected = [f"shards/gate-gpu-{a.shard.split('/')[0]}/{a.out}" for a in sorted(gpu, key=lambda a: a.shard)]
    assert merge.merge == expected
    # ... the whole folder: the merge judges each case again from its outputs files (issue 43)
    uploads = [s for s in workflows["gpu.yml"]["jobs"]["gpu"]["steps"] if s.get("uses", "").startswith(
        "actions/upload-artifact") and "junit/" in str(s.get("with", {}).get("path"))]
    assert [p.strip() for s in uploads for p in s["with"]["path"].splitlines() if p.startswith(gpu[0].out)] \
        == [f"{gpu[0].out}/"]
    assert all(a.device == "cuda" and a.junit and a.report for a in gpu)
