"""``gdncheck engines`` as a referee that can be trusted (issues 35 and 37): a crash is never a pass, a known
finding explains only what was measured for it, NaN is said, a hang is stopped, an engine's output is bounded
and may be any bytes, bad input is exit 2, a run that judged nothing is no success, the command writes into no
fixture suite and over no file it did not make, one writer per folder. The matrix itself:
tests/engines/test_engines.py."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from gdncheck.cli import main as cli
from gdncheck.conformance.engines import matrix, probe, registry, schema
from gdncheck.reports import engines as pages

ONE = ["--engine", "reference", "--profile", "f32", "--case", "prefill-decode_T65", "--diagnose", "0", "-q"]


def _summary(*cases) -> dict:
    return {"cases": list(cases), "verdict": "fail", "exit_code": 1, "coverage": {"tensors_judged": 3}}


def _tensor_case(case_id, *, nan=0, max_err=4e-3, elem=1e-3, stage="delta_rule", tensor="recurrent_state"):
    return {"id": case_id, "status": "fail",
            "first_divergence": {"step": 1, "call": 0, "stage": stage, "tensor": tensor, "reason": "nan" if nan else
                                 "elem_bound"},
            "records": [{"step": 1, "call": 0, "stage": stage, "tensor": tensor, "verdict": "fail",
                         "metrics": {"max_err": max_err, "nmse": 0.0, "nan": nan, "numel": 1024},
                         "bound": {"elem": elem, "nmse": 1.0}}]}


# --- 35, item 3: the matrix -------------------------------------------------------------------------------
def test_a_crash_is_a_failure_even_where_verify_passed_the_case():
    crash = {"id": "error-moe-missing-moe-size_T0", "status": "pass",
             "error_check": {"expected": "missing_config_key", "actual": "ZeroDivisionError", "match": "family",
                             "actual_message": "float division by zero", "actual_step": 0}}
    table = {("mlx", "error-moe-missing-moe-size", "*"): schema.Finding("engine_crash", "known",
                                                                          None, {"exception": "ZeroDivisionError"})}
    r = matrix.profile_result(_summary(crash, {"id": "ok_T1", "status": "pass", "records": []}), "mlx", "f32", table)
    assert r["counts"]["pass"] == 1 and r["counts"]["fail"] == 1 and r["verdict"] == "fail"
    (f,) = r["findings"]
    assert f["status"] == "fail" and f["verify_status"] == "pass" and f["class"] == "engine_crash"
    assert not f["unexplained"]  # known, and still a failure
    assert "fail (verify: pass)" in pages.stable_block({"engines": [
        {"name": "mlx", "judged": "end_to_end", "status": "ran", "profiles_run": ["f32"], "results": {"f32": r}}]},
        None)


def test_a_known_finding_explains_only_the_magnitude_and_nan_measured_for_it():
    race = {("doppler", "x", "f32"): schema.Finding("deviation", "a race", None,
                                                      {"stage": "delta_rule", "ratio": (1e8, float("inf"))})}
    nan_case, huge, small = (_tensor_case("x_nan", nan=7, max_err=1e-4), _tensor_case("x_huge", max_err=1e6),
                             _tensor_case("x_small", max_err=3e-3))
    r = matrix.profile_result(_summary(nan_case, huge, small), "doppler", "f32", race)
    by = {f["case"]: f for f in r["findings"]}
    assert not by["x_nan"]["unexplained"] and not by["x_huge"]["unexplained"]
    assert by["x_small"]["unexplained"] and "ratio 3 (FINDINGS: 1e+08 to inf)" in by["x_small"]["mismatch"]
    no_nan = {("llamacpp", "x", "*"): schema.Finding("deviation", "softplus", None, {"nan": False,
                                                                                      "ratio": (1.0, 20.0)})}
    r = matrix.profile_result(_summary(nan_case, small), "llamacpp", "f32", no_nan)
    by = {f["case"]: f for f in r["findings"]}
    assert by["x_nan"]["unexplained"] and "NaN found (FINDINGS: no NaN)" in by["x_nan"]["mismatch"]
    assert not by["x_small"]["unexplained"]
    stage = {("llamacpp", "x", "*"): schema.Finding("deviation", "softplus", None, {"stage": "gates"})}
    (f,) = matrix.profile_result(_summary(small), "llamacpp", "f32", stage)["findings"]
    assert f["unexplained"] and "stage 'delta_rule' (FINDINGS: 'gates')" in f["mismatch"]


def test_nan_is_said_as_nan_not_as_a_ratio():
    (f,) = matrix.profile_result(_summary(_tensor_case("x_nan", nan=7, max_err=1e-4)), "doppler", "f32",
                                   {})["findings"]
    assert f["adjudication"]["nan"] == 7 and f["adjudication"]["ratio"] == pytest.approx(0.1)
    text = pages.adjudication_text(f)
    assert "NaN in 7 of 1024 elements" in text and "bound" not in text


def test_help_names_every_registered_engine(capsys):
    with pytest.raises(SystemExit):
        cli(["engines", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert all(name in out for name in registry.ENGINES), out
    assert "--timeout" in out


def test_the_default_of_each_engine_is_the_code_a_user_runs():
    assert registry.ENGINES["fla"].options == {"kernel": "chunk"}  # its Triton kernels (interpreted on a CPU)
    assert "naive" in registry.ENGINES["fla"].option_values["kernel"]


# --- 37: bad input, pages, locks ----------------------------------------------------------------------------
@pytest.mark.parametrize("option, words", [
    ("fla:kernel=bogus", "expected --option fla:kernel= one of naive, naive_chunk, fused_recurrent, chunk, "
                         "found 'bogus'"),
    ("mlx:threads=2", "expected --option mlx:KEY=VALUE with KEY none"),
    ("ggml:thread=2", "expected --option ggml:KEY=VALUE with KEY one of threads"),
])
def test_a_bad_option_is_exit_2_and_one_line(tmp_path, capsys, option, words):
    rc = cli(["engines", "--out", str(tmp_path / "out"), *ONE, "--option", option])
    err = capsys.readouterr().err
    assert rc == 2 and words in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_a_run_that_judged_nothing_is_not_a_success(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GDN_DOPPLER_DIR", str(tmp_path / "nowhere"))
    rc = cli(["engines", "--out", str(tmp_path / "out"), "--engine", "doppler"])
    out = capsys.readouterr().out
    assert rc == 1 and "nothing was judged" in out and "findings: none" in out


@pytest.mark.parametrize("target", ["manifest.json", "golden", "new.md"])
def test_no_page_is_written_into_a_fixture_suite(tmp_path, fixture_copy, capsys, target):
    name = {"golden": next(p.name for p in fixture_copy.glob("*.safetensors")), }.get(target, target)
    path = fixture_copy / name
    before = path.read_bytes() if path.exists() else None
    for flag in ("--markdown", "--html"):
        rc = cli(["engines", "--out", str(tmp_path / "out"), *ONE, flag, str(path)])
        err = capsys.readouterr().err
        assert rc == 2 and "lies in the fixture suite" in err and err.count("\n") == 1, err
        assert (path.read_bytes() if path.exists() else None) == before
    assert not (tmp_path / "out").exists()


def test_no_page_replaces_a_file_the_command_did_not_make(tmp_path, capsys):
    mine = tmp_path / "notes.md"
    mine.write_text("# my notes\n\nnothing generated here\n")
    html = tmp_path / "view.html"
    html.write_text("<html><title>mine</title></html>\n")
    swapped = tmp_path / "swapped.md"
    swapped.write_text(f"head\n{pages.STABLE_END}\nmiddle\n{pages.STABLE_BEGIN}\ntail\n")
    for flag, path, words in (("--markdown", mine, "found 0 BEGIN and 0 END"),
                              ("--html", html, "is not an HTML view"),
                              ("--markdown", swapped, "BEGIN marker before its END marker")):
        before = path.read_text()
        rc = cli(["engines", "--out", str(tmp_path / "out"), *ONE, flag, str(path)])
        err = capsys.readouterr().err
        assert rc == 2 and words in err and err.count("\n") == 1 and "internal error" not in err, err
        assert path.read_text() == before
    # a page with the markers keeps its text; an HTML view the command wrote is replaced
    page = tmp_path / "page.md"
    page.write_text(f"# kept\n\n{pages.STABLE_BEGIN}\nold\n{pages.STABLE_END}\n\nkept too\n")
    rc = cli(["engines", "--out", str(tmp_path / "out"), *ONE, "--markdown", str(page), "--html", str(html.with_name(
        "ours.html"))])
    assert rc == 0
    text = page.read_text()
    assert text.startswith("# kept\n") and "kept too" in text and "| reference | end-to-end | f32 | 1 | 1 |" in text
    rc = cli(["engines", "--out", str(tmp_path / "out"), *ONE, "--html", str(html.with_name("ours.html"))])
    assert rc == 0


def test_a_second_writer_of_one_folder_is_refused(tmp_path, capsys):
    from gdncheck.untrusted import folder_lock

    out = tmp_path / "out"
    with folder_lock(out, "--out", command="gdncheck engines (the first)"):
        rc = cli(["engines", "--out", str(out), *ONE])
    err = capsys.readouterr().err
    assert rc == 2 and "gdncheck engines (the first)" in err and err.count("\n") == 1, err
    assert not (out / "matrix.json").exists()
    assert cli(["engines", "--out", str(out), *ONE]) == 0  # released: the next run writes


def test_a_backtick_in_the_suite_name_keeps_the_markdown_whole():
    assert pages.code_span("a`b") == "``a`b``" and pages.code_span("`x") == "`` `x ``"
    matrix = {"command": "gdncheck engines --case `x`", "tool": {"version": "0"}, "seconds": 1.0,
              "fixtures": {"suite": "my `suite`", "manifest_sha256": "0" * 64}, "engines": []}
    line = pages.run_block(matrix).splitlines()[2]
    assert "fixtures `` my `suite` `` (" in line and "by `` gdncheck engines --case `x` `` with" in line


# --- 37: an engine's program: any output, bounded; a hang stopped -----------------------------------------------
def _program_engine(monkeypatch, code: str):
    eng = schema.Engine("prog", "prog", "fused", ("f32",), (), (), "nothing to install", "a test program",
                          command=(sys.executable, "-c", code))
    monkeypatch.setitem(registry.ENGINES, "prog", eng)


def test_an_engine_programs_output_may_be_any_bytes_and_is_bounded_on_disk(tmp_path, monkeypatch):
    """Issue 43, item 6: 10 MB of output (250 MB before: kept whole) is kept as its first 256 kB and last
    768 kB, with a line saying how much was left out between; the last line is still quoted."""
    head, tail = 256 * 1024, 768 * 1024  # what docs/engines.md promises (gdncheck/commands/engines.py)
    code = ("import sys; w = sys.stdout.buffer.write\n"
            "w(b'the first word\\n')\n"
            "for _ in range(160): w(bytes(range(256)) * 256)\n"  # 10 MB, none of it UTF-8
            "w(b'\\xff\\xfe the last word \\xc3\\n'); sys.exit(5)")
    _program_engine(monkeypatch, code)
    rc = cli(["engines", "--out", str(tmp_path / "out"), "--engine", "prog", "-q", "--diagnose", "0"])
    m = json.loads((tmp_path / "out" / "matrix.json").read_text())
    r = m["engines"][0]["results"]["f32"]
    assert rc == 1 and r["status"] == "could_not_run"
    assert "exited 5" in r["problem"] and "the last word" in r["problem"] and len(r["problem"]) < 400
    kept = (tmp_path / "out" / "prog" / "f32" / "program-output.txt").read_bytes()
    total = len(b"the first word\n") + 160 * 65536 + len(b"\xff\xfe the last word \xc3\n")
    left_out = total - head - tail
    assert kept.startswith(b"the first word\n") and kept.endswith(b" the last word \xc3\n")
    assert f"[gdncheck: {left_out} bytes of the program's output left out here".encode() in kept
    assert len(kept) < head + tail + 200


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie no reaper has collected yet is dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.parametrize("exit_code", [5, 0])
def test_a_background_child_of_an_engine_program_does_not_outlive_the_run(tmp_path, monkeypatch, exit_code):
    """Issue 43, item 6: a child the program leaves running (its output pipe still open) is killed with its
    process group when the program ends; before, it ran on after the matrix was written."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("reads a process's state from /proc")
    pid_file = tmp_path / "child.pid"
    code = ("import subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); print('started', flush=True); sys.exit({exit_code})")
    _program_engine(monkeypatch, code)
    t0 = time.monotonic()
    rc = cli(["engines", "--out", str(tmp_path / "out"), "--engine", "prog", "-q", "--diagnose", "0"])
    assert time.monotonic() - t0 < 30 and rc == 1
    pid = int(pid_file.read_text())
    for _ in range(50):  # SIGKILL is delivered at once; its reaper may take a moment
        if not _alive(pid):
            break
        time.sleep(0.1)
    assert not _alive(pid), f"the program's child {pid} outlived the run"


def test_a_writer_that_escaped_the_programs_group_does_not_hold_the_run(tmp_path, monkeypatch):
    """A child that leaves the program's session (setsid) and keeps writing into the output pipe is not
    waited for: the matrix is written within seconds of the program's end."""
    import os
    import signal

    pid_file = tmp_path / "child.pid"
    child = "import os, sys, time; os.setsid(); [(sys.stdout.write('x' * 100 + '\\n'), sys.stdout.flush(), " \
            "time.sleep(0.01)) for _ in range(6000)]"
    code = ("import subprocess, sys\n"
            f"p = subprocess.Popen([sys.executable, '-c', {child!r}])\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); sys.exit(5)")
    _program_engine(monkeypatch, code)
    t0 = time.monotonic()
    try:
        rc = cli(["engines", "--out", str(tmp_path / "out"), "--engine", "prog", "-q", "--diagnose", "0"])
        assert rc == 1 and time.monotonic() - t0 < 20
    finally:
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_program_that_exits_0_having_written_nothing_is_no_run(tmp_path, monkeypatch):
    """Issue 43, item 6: an engine program that exits 0 (or 2) writing no outputs file is a run that could
    not be made, and the matrix exits 1 even where another engine judged cases; before, its row 'ran' (every
    case unusable) and the matrix exited 0."""
    for code in ("print('all good')", "import sys; sys.exit(2)"):
        _program_engine(monkeypatch, code)
        rc = cli(["engines", "--out", str(tmp_path / "out"), "--engine", "prog", "--engine", "reference",
                  "--profile", "f32", "--case", "prefill-decode_T65", "--diagnose", "0", "-q"])
        m = json.loads((tmp_path / "out" / "matrix.json").read_text())
        r = next(e for e in m["engines"] if e["name"] == "prog")["results"]["f32"]
        assert rc == 1 and r["status"] == "could_not_run", r
        assert "having written no outputs file" in r["problem"] and m["totals"]["could_not_run"] == 1
        assert next(e for e in m["engines"] if e["name"] == "reference")["results"]["f32"]["counts"]["pass"] == 1


def test_a_hung_engine_is_stopped_at_the_timeout(tmp_path, monkeypatch):
    _program_engine(monkeypatch, "import time; time.sleep(120)")
    t0 = time.monotonic()
    rc = cli(["engines", "--out", str(tmp_path / "out"), "--engine", "prog", "--timeout", "1", "-q"])
    assert time.monotonic() - t0 < 30
    r = json.loads((tmp_path / "out" / "matrix.json").read_text())["engines"][0]["results"]["f32"]
    assert rc == 1 and r["status"] == "could_not_run" and "ran past --timeout 1 s" in r["problem"]


def test_an_in_process_engine_past_the_timeout_is_stopped(tmp_path, monkeypatch):
    from gdncheck.conformance.ports import run as runner

    real = runner.run_impl

    def slow(*args, **kwargs):
        time.sleep(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "run_impl", slow)
    t0 = time.monotonic()
    rc = cli(["engines", "--out", str(tmp_path / "out"), *ONE, "--timeout", "1"])
    assert time.monotonic() - t0 < 30
    r = json.loads((tmp_path / "out" / "matrix.json").read_text())["engines"][0]["results"]["f32"]
    assert rc == 1 and r["status"] == "could_not_run" and "ran past --timeout 1 s" in r["problem"]


@pytest.mark.parametrize("flag, value, words", [
    # issue 43, item 6: 1e308 was an internal error per run (setitimer's range), 1e-300 no timer at all
    *(("--timeout", v, "expected --timeout a number of seconds from 0.1 to 86400") for v in (
        "0", "-1", "nan", "inf", "1e308", "86401", "1e-300", "0.05")),
    ("--diagnose", "-1", "expected --diagnose N a count of cases"),
])
def test_a_bad_timeout_or_diagnose_is_exit_2(tmp_path, capsys, flag, value, words):
    rc = cli(["engines", "--out", str(tmp_path / "out"), *ONE, flag, value])
    err = capsys.readouterr().err
    assert rc == 2 and words in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


# --- the doppler glue error behind the race (where doppler runs) ------------------------------------------------
def test_a_glue_error_in_doppler_is_unexplained_where_the_race_does_not_hide_it(tmp_path, monkeypatch):
    if not probe.probe(registry.ENGINES["doppler"]).installed or not shutil.which("node"):
        pytest.skip("doppler's glue is not installed here (docs/engines.md)")
    monkeypatch.setenv("GDN_DOPPLER_GLUE_MUTANT", "state_transposed")
    rc = cli(["engines", "--out", str(tmp_path / "out"), "--engine", "doppler", "--case", "moe-e256-k8",
              "--case", "f16-state_T", "--diagnose", "0", "-q"])
    r = json.loads((tmp_path / "out" / "matrix.json").read_text())["engines"][0]["results"]["f32"]
    assert rc == 0 and r["status"] == "ran", r
    assert r["unexplained"] == 2 and all(f["adjudication"]["stage"] == "delta_rule" for f in r["findings"])


# --- the repros: 0 fixed, 1 reproduces, 3 cannot run --------------------------------------------------------------
#: the engines' folders, each with its repros/
ENGINES_DIR = Path(__file__).resolve().parents[2] / "conformance" / "engines"


@pytest.mark.parametrize("script, blocked", [
    ("mlx_int32_input.py", ("mlx", "mlx.core", "mlx_lm")),
    ("mlx_missing_moe_size.py", ("mlx_lm",)),
    ("llamacpp_softplus.py", ("llama_cpp",)),
    ("doppler_webgpu.py", ()),  # its engine is a Node program: $GDN_DOPPLER_DIR names a folder without it
])
def test_a_repro_that_cannot_run_its_engine_exits_3_not_1(tmp_path, script, blocked):
    import os
    import subprocess

    [path] = ENGINES_DIR.glob(f"*/repros/{script}")
    code = ("import runpy, sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in blocked)
            + f"runpy.run_path({str(path)!r}, run_name='__main__')\n")
    env = {**os.environ, "GDN_DOPPLER_DIR": str(tmp_path / "nowhere")}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 3, (run.returncode, run.stdout, run.stderr)
    assert "cannot run" in run.stderr and "Traceback" not in run.stderr
