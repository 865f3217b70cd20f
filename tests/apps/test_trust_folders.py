"""Trust, folders (issue 26, item 4): one writer per output folder, no run mixed with another, no file
name of a run used twice, and no case id that aborts a run.

Each test failed on the main before the change: a second writer into a folder held by another gdncheck
was not refused (exit 0), a run of bf16 into a folder of f32 outputs was exit 0 and verify judged
the mix, a snapshot file named like a case's outputs file overwrote it (and one named like a summary
was deleted as stale), and a case id of 100 000 characters aborted the whole run with no file written.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gdncheck.fixtures.manifest import DEFAULT_DIR
from gdncheck.safetensors_io import SafetensorsFile
from gdncheck.untrusted import LOCK_NAME, FolderBusyError, folder_lock, lock_file_of

GDNCHECK = str(Path(sys.executable).with_name("gdncheck"))
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1")
ENV.pop("GDN_DEBUG", None)

DECODE = "decode_T12_Hk2_Hv4_dk16_dv16_s0"
PREFILL = "prefill_T1_Hk1_Hv1_dk16_dv16_s0"


def _manifest() -> dict:
    return json.loads((DEFAULT_DIR / "manifest.json").read_text())


SNAPSHOT = next(c["id"] for c in _manifest()["cases"] if any(s["op"] == "save" for s in c["program"]))


def _cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([GDNCHECK, *map(str, args)], capture_output=True, text=True, env=ENV, cwd=cwd, timeout=600)


def _refused(r: subprocess.CompletedProcess, *words: str) -> str:
    """Exit 2, one line on stderr (holding every word), no traceback."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in r.stderr + r.stdout, r.stderr[-3000:]
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _suite(root: Path, ids: list[str], edit=None) -> Path:
    """A copy of the default suite holding only ``ids``; ``edit(manifest)`` changes its manifest."""
    doc = _manifest()
    doc["cases"] = [c for c in doc["cases"] if c["id"] in ids]
    dest = root / "suite"
    dest.mkdir()
    for c in doc["cases"]:
        shutil.copyfile(DEFAULT_DIR / c["file"], dest / c["file"])
    if edit:
        edit(doc)
    (dest / "manifest.json").write_text(json.dumps(doc))
    return dest


# --- 1. one writer per folder -------------------------------------------------------------------


def test_a_second_writer_into_a_held_folder_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "out"
    with folder_lock(out, "--out", command="gdncheck run reference --profile f32 (the first)"):
        before = _tree(tmp_path)
        r = _cli("run", "reference", "--out", out, "--profile", "bf16", "--case", DECODE)
        line = _refused(r, f"gdncheck process {os.getpid()}", "the first", str(out), "one writer per folder")
        assert "being written" in line
        assert _tree(tmp_path) == before  # nothing written, the holder's lock untouched
        r = _cli("verify", "--outputs", out, "--profile", "f32")
        _refused(r, str(os.getpid()), str(out))
        assert _tree(tmp_path) == before
    assert not (out / LOCK_NAME).exists()  # released: removed
    with pytest.raises(FolderBusyError):  # in one process, too
        with folder_lock(out):
            folder_lock(out)


def test_report_export_and_build_take_the_lock_beside_their_folder(tmp_path):
    for argv, folder in ((["fixtures", "export", tmp_path / "exp"], tmp_path / "exp"),
                         (["fixtures", "build", "--out", tmp_path / "built", "--case", DECODE], tmp_path / "built")):
        with folder_lock(folder, beside=True, command="the other writer"):
            before = _tree(tmp_path)
            _refused(_cli(*argv), "the other writer", str(folder))
            assert _tree(tmp_path) == before and not folder.exists()
    run = _cli("run", "reference", "--out", tmp_path / "o", "--profile", "f32", "--case", DECODE)
    assert run.returncode == 0, run.stderr
    assert _cli("verify", "--outputs", tmp_path / "o", "--profile", "f32", "--case", DECODE, "-q").returncode == 0
    with folder_lock(tmp_path / "rep", beside=True, command="the other report"):
        before = _tree(tmp_path)
        _refused(_cli("report", tmp_path / "o" / "verify-summary-f32.json", "-o", tmp_path / "rep", "-q"),
                 "the other report")
        assert _tree(tmp_path) == before


def test_a_gate_into_a_held_folder_is_refused(tmp_path):
    out = tmp_path / "gate"
    with folder_lock(out, command="the first gate"):
        before = _tree(tmp_path)
        r = _cli("gate", "--impl", "reference", "--out", out, "--case", DECODE, "--profiles", "f32", "--no-properties")
        _refused(r, "the first gate", str(out))
        assert _tree(tmp_path) == before


def test_a_stale_lock_is_taken_over_with_a_note(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that is gone
    (out / LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "command": "gdncheck run killed", "started": "then"}))
    r = _cli("run", "reference", "--out", out, "--profile", "f32", "--case", DECODE)
    assert r.returncode == 0, r.stderr
    assert "took over the lock" in r.stderr and str(dead.pid) in r.stderr and "gone" in r.stderr
    assert (out / f"{DECODE}.safetensors").is_file() and not (out / LOCK_NAME).exists()


def test_a_lock_file_that_is_a_link_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).symlink_to(tmp_path / "elsewhere")
    _refused(_cli("run", "reference", "--out", out, "--profile", "f32", "--case", DECODE), str(out))
    assert not (tmp_path / "elsewhere").exists()
    assert lock_file_of(out) == out / LOCK_NAME


# --- 1b. one run per folder ---------------------------------------------------------------------


def test_a_run_into_a_folder_of_another_run_is_refused_unless_overwrite(tmp_path):
    out = tmp_path / "out"
    assert _cli("run", "reference", "--out", out, "--profile", "f32", "--case", DECODE).returncode == 0
    assert _cli("run", "reference", "--out", out, "--profile", "f32", "--case", PREFILL).returncode == 0  # same run
    before = _tree(tmp_path)
    r = _cli("run", "reference", "--out", out, "--profile", "bf16", "--case", DECODE)
    _refused(r, "another run", "profile f32", "--overwrite", str(out))
    assert _tree(tmp_path) == before
    r = _cli("run", "reference", "--out", out, "--profile", "f32", "--case", DECODE, "--option", "placement=fla")
    _refused(r, "another run")  # other options: another run too
    r = _cli("run", "reference", "--out", out, "--profile", "bf16", "--case", DECODE, "--overwrite")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == [f"{DECODE}.safetensors"]  # the f32 run's files removed
    assert SafetensorsFile(out / f"{DECODE}.safetensors").metadata["profile"] == "bf16"


def test_verify_refuses_a_folder_holding_two_runs(tmp_path):
    a, b = tmp_path / "f32", tmp_path / "bf16"
    assert _cli("run", "reference", "--out", a, "--profile", "f32", "--case", DECODE).returncode == 0
    assert _cli("run", "reference", "--out", b, "--profile", "bf16", "--case", PREFILL).returncode == 0
    shutil.copyfile(b / f"{PREFILL}.safetensors", a / f"{PREFILL}.safetensors")  # a mix, made by hand
    (a / "verify-summary-f32.json").write_text("{}")  # an earlier verdict
    before = {k: v for k, v in _tree(tmp_path).items() if "verify-summary" not in k}
    r = _cli("verify", "--outputs", a, "--profile", "f32", "--case", DECODE, "--case", PREFILL)
    _refused(r, "2 different runs", "profile f32", "profile bf16", PREFILL)
    assert _tree(tmp_path) == before  # no summary, and the stale one removed


# --- 2. names used twice ------------------------------------------------------------------------


def _rename_snapshot(name: str):
    def edit(doc):
        for c in doc["cases"]:
            for step in c["program"]:
                if step["op"] in ("save", "load"):
                    step["file"] = name
    return edit


@pytest.mark.parametrize("name", [f"{DECODE}.safetensors", "verify-summary-f32.json", LOCK_NAME])
def test_a_snapshot_file_named_like_another_file_of_the_run_skips_its_case(tmp_path, name):
    suite = _suite(tmp_path, [DECODE, SNAPSHOT], _rename_snapshot(name))
    out = tmp_path / "out"
    r = _cli("run", "reference", "--fixtures", suite, "--out", out, "--profile", "f32")
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr, r.stderr
    skipped = [ln for ln in r.stdout.splitlines() if ln.startswith("skipped") and SNAPSHOT in ln]
    assert len(skipped) == 1 and "step" in skipped[0] and repr(name) in skipped[0], r.stdout
    if name.startswith(DECODE):
        assert f"the outputs file of case {DECODE}" in skipped[0]
    assert sorted(p.name for p in out.iterdir()) == [f"{DECODE}.safetensors"]  # the snapshot case wrote nothing
    assert SafetensorsFile(out / f"{DECODE}.safetensors").metadata["case"] == DECODE  # never overwritten


# --- 3. a case id too long for a file name -------------------------------------------------------


def test_a_case_id_too_long_for_a_file_name_is_that_cases_problem(tmp_path):
    long_id = "a" * 100_000

    def edit(doc):
        for c in doc["cases"]:
            if c["id"] == PREFILL:
                c["id"] = long_id

    suite = _suite(tmp_path, [DECODE, PREFILL], edit)
    out = tmp_path / "out"
    r = _cli("run", "reference", "--fixtures", suite, "--out", out, "--profile", "f32")
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr, r.stderr[-2000:]
    assert (out / f"{DECODE}.safetensors").is_file()  # the other case ran
    assert "at most 200 characters" in r.stdout and "100000 characters" in r.stdout
    assert max(len(ln) for ln in (r.stdout + r.stderr).splitlines()) < 3000  # never the id printed whole
    v = _cli("verify", "--fixtures", suite, "--outputs", out, "--profile", "f32", "-q")
    assert v.returncode == 2 and "Traceback" not in v.stdout + v.stderr, v.stderr[-2000:]
    doc = json.loads((out / "verify-summary-f32.json").read_text())
    status = {c["id"]: c["status"] for c in doc["cases"]}
    assert status[DECODE] == "pass" and list(status.values()).count("error") == 1
