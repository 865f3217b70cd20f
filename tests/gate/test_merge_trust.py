"""Trust, fourth round (issue 43, item 1): ``gate --merge`` writes only where a plain gate may, and
takes no shard's verdict on trust.

Each test failed on main at ad695e6: the merge wrote its JUnit XML over a fixture suite's
manifest.json, into and beside a suite, over a user's notes file, into a user's ``OUT/f32``, and
into (over) a shard it was reading, all exit 0; two shard folders with no outputs files, or with
summaries edited to say "pass" over a broken port's outputs, merged to "conforms" (exit 0); a
summary that is a link out of its shard folder was read; a case moved from a shard's verify summary
to its skipped list was never judged, and ``--fixtures`` naming another suite was ignored.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gdncheck.cli import main
from gdncheck.fixtures.manifest import DEFAULT_DIR
from gdncheck.gate import GateOptions, run_gate

CASES = ["prefill_T1_", "decode_T12", "snapshot-replay", "error-head-ratio"]
MUTANT = "gdncheck.conformance.meta.mutants:norm_weight_plain"  # every case with a layer call fails at input_norm
PROFILES = ("f32", "bf16")


def _shards(base: Path, impl: str, profiles=PROFILES) -> list[Path]:
    out = []
    for i in range(2):
        res = run_gate(GateOptions(impl=impl, profiles=profiles, cases=CASES, shard=(i, 2), out=str(base / f"s{i}"),
                                   properties=False, rebuild_check=False, jobs=1))
        assert res.exit_code == (0 if impl == "reference" else 1), res.doc.get("reason")
        out.append(base / f"s{i}")
    return out


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """The two shards of a conforming port (the reference), f32 and bf16."""
    return _shards(tmp_path_factory.mktemp("good"), "reference")


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """The two shards of a port that fails every case with a layer call (f32 only)."""
    return _shards(tmp_path_factory.mktemp("broken"), MUTANT, ("f32",))


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _copy(shards: list[Path], dst: Path) -> list[Path]:
    dst.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copytree(s, dst / s.name, symlinks=True)) for s in shards]


def _merge(capsys, shards, *argv) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["gate", "--merge", *map(str, shards), *map(str, argv)])
    return code, capsys.readouterr().err


def _refused(code: int, err: str, *words: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err[-3000:])
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


# --- the merge's writes: the plain gate's guard -----------------------------------------------------------------

def _attack(name: str, root: Path, shards: list[Path]) -> tuple[list, tuple[str, ...]]:
    """(the merge's output flags, words its refusal names) for one hostile set of output paths."""
    suite = root / "suite"  # a fixture suite: a folder whose manifest.json is of format gdncheck-fixtures
    suite.mkdir()
    shutil.copyfile(DEFAULT_DIR / "manifest.json", suite / "manifest.json")
    (root / "notes.txt").write_text("my notes\n")
    (root / "user" / "f32").mkdir(parents=True)
    (root / "user" / "f32" / "mine.txt").write_text("someone's\n")
    (root / "mine").mkdir()
    (root / "mine" / "gate-summary.json").write_text('{"mine": true}\n')
    (root / "linked" / "elsewhere").mkdir(parents=True)
    (root / "linked" / "out").mkdir()
    (root / "linked" / "out" / "f32").symlink_to(root / "linked" / "elsewhere")
    s0, s1 = shards
    return {
        "junit over a suite's manifest": (["--out", root / "m", "--junit", suite / "manifest.json"],
                                          ("--junit", "fixture suite")),
        "out inside a suite": (["--out", suite / "m"], ("--out", "fixture suite")),
        "report inside a suite": (["--out", root / "m", "--report", suite / "r"], ("--report", "fixture suite")),
        "junit over a user's notes": (["--out", root / "m", "--junit", root / "notes.txt"],
                                      ("--junit", "not a JUnit file gdncheck wrote")),
        "out a user's profile folder": (["--out", root / "user"], ("not written by gdncheck gate",)),
        "out over a user's gate-summary.json": (["--out", root / "mine"], ("not a gate summary gdncheck wrote",)),
        "out a shard": (["--out", s0], ("--out", "is the shard folder")),
        "out inside a shard": (["--out", s0 / "sub"], ("--out", "lies inside the shard folder")),
        "out around the shards": (["--out", s0.parent], ("--out", "contains the shard folder")),
        "junit into a shard": (["--out", root / "m", "--junit", s1 / "gate-junit.xml"],
                               ("--junit", "lies inside the shard folder")),
        "report a shard": (["--out", root / "m", "--report", s1], ("--report", "is the shard folder")),
        "report the out folder": (["--out", root / "m", "--report", root / "m"], ("--report", "a folder of --out")),
        "report a profile folder of out": (["--out", root / "m", "--report", root / "m" / "bf16"],
                                           ("--report", "a folder of --out")),
        "out's profile folder a link": (["--out", root / "linked" / "out"], ("is a symbolic link",)),
    }[name]


ATTACKS = ["junit over a suite's manifest", "out inside a suite", "report inside a suite", "junit over a user's notes",
           "out a user's profile folder", "out over a user's gate-summary.json", "out a shard", "out inside a shard",
           "out around the shards", "junit into a shard", "report a shard", "report the out folder",
           "report a profile folder of out", "out's profile folder a link"]


@pytest.mark.parametrize("name", ATTACKS)
def test_the_merge_writes_only_where_a_gate_may(good, tmp_path, capsys, name):
    shards = _copy(good, tmp_path / "shards")
    argv, words = _attack(name, tmp_path, shards)
    before = _tree(tmp_path)
    _refused(*_merge(capsys, shards, *argv), *words)
    assert _tree(tmp_path) == before  # nothing written, replaced or removed; no folder made
    assert not (tmp_path / "m").exists()


def test_the_plain_gate_keeps_a_users_file_named_like_its_own(tmp_path, capsys):
    """A plain gate removed OUT/gate-summary.json and OUT/gate-junit.xml as stale, whoever made them."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "gate-junit.xml").write_text("<notes>mine</notes>\n")
    before = _tree(tmp_path)
    capsys.readouterr()
    code = main(["gate", "--impl", "reference", "--profiles", "f32", "--case", "prefill_T1_", "--no-properties",
                 "--no-rebuild-check", "--jobs", "1", "-q", "--out", str(out)])
    _refused(code, capsys.readouterr().err, "gate-junit.xml", "not a JUnit file gdncheck wrote")
    assert _tree(tmp_path) == before


def test_a_merge_into_a_good_folder_replaces_only_its_own(good, tmp_path, capsys):
    """The same merge twice into one OUT (the gate's own files replaced), a user's file beside them kept."""
    out = tmp_path / "m"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    for _ in range(2):
        code, err = _merge(capsys, good, "--out", out, "--junit", tmp_path / "j.xml")
        assert code == 0, err
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "f32" / ".gdncheck-gate").is_file()
    assert sorted(p.name for p in out.iterdir()) == ["bf16", "f32", "gate-junit.xml", "gate-summary.json",
                                                     "notes.txt"]


# --- what a merge reads: verified ------------------------------------------------------------------------------

def test_shards_without_outputs_files_are_refused(good, tmp_path, capsys):
    shards = _copy(good, tmp_path / "shards")
    for s in shards:
        for f in s.glob("*/*.safetensors"):
            f.unlink()
    err = _refused(*_merge(capsys, shards, "--out", tmp_path / "m"), "shard 0/2, case ", "no outputs file",
                   "a merge takes no shard's verdict on trust")
    assert str(shards[0]) in err
    assert not (tmp_path / "m").exists()


def test_summaries_edited_to_pass_are_refused(broken, tmp_path, capsys):
    """A broken port's shards, each summary consistently edited to say pass: the outputs say otherwise."""
    shards = _copy(broken, tmp_path / "shards")
    for s in shards:
        path = s / "f32" / "verify-summary-f32.json"
        v = json.loads(path.read_text())
        for c in v["cases"]:
            c.update(status="pass", first_divergence=None, message=None, diagnosis=None)
            for r in c["records"]:
                r["verdict"] = "pass"
        path.write_text(json.dumps(v))
        doc = json.loads((s / "gate-summary.json").read_text())
        doc.update(verdict="conforms", exit_code=0)
        doc["profiles"]["f32"].update(verdict="conforms", exit_code=0, failures=[])
        (s / "gate-summary.json").write_text(json.dumps(doc))
    err = _refused(*_merge(capsys, shards, "--out", tmp_path / "m"), "case ", "(f32): expected its outputs to judge "
                   "as its summary says, pass (", "judge fail (")
    assert str(shards[0]) in err and not (tmp_path / "m").exists()
    # the shards as they were: merged, judged again, the same verdict as each shard's
    code, err = _merge(capsys, broken, "--out", tmp_path / "m2")
    assert code == 1, err
    doc = json.loads((tmp_path / "m2" / "gate-summary.json").read_text())
    assert {f["first_divergence"]["stage"] for f in doc["profiles"]["f32"]["failures"]} == {"input_norm"}


def test_an_outputs_file_of_another_case_is_refused(good, tmp_path, capsys):
    shards = _copy(good, tmp_path / "shards")
    files = sorted((shards[0] / "f32").glob("*.safetensors"))
    assert len(files) == 2
    shutil.copyfile(files[0], files[1])  # one case's outputs under another case's name
    _refused(*_merge(capsys, shards, "--out", tmp_path / "m"), f"case {files[1].stem} (f32)", "judge error")


@pytest.mark.parametrize("what", ["gate-summary.json", "f32/verify-summary-f32.json", "f32"])
def test_what_a_shard_links_out_of_its_folder_is_not_read(good, tmp_path, capsys, what):
    shards = _copy(good, tmp_path / "shards")
    elsewhere = tmp_path / "elsewhere"
    shutil.move(shards[1] / what, elsewhere)
    (shards[1] / what).symlink_to(elsewhere)
    _refused(*_merge(capsys, shards, "--out", tmp_path / "m"), str(shards[1]), "points outside")
    assert not (tmp_path / "m").exists()


def test_a_case_moved_to_the_skipped_list_is_refused(good, tmp_path, capsys):
    """A skip is no verdict: only a case the gate skips on the interpreter may be listed skipped."""
    shards = _copy(good, tmp_path / "shards")
    s = shards[1]
    for p in PROFILES:
        path = s / p / f"verify-summary-{p}.json"
        v = json.loads(path.read_text())
        moved = v["cases"].pop(0)["id"]
        path.write_text(json.dumps(v))
    doc = json.loads((s / "gate-summary.json").read_text())
    doc["selection"]["skipped"].append({"case": moved, "profiles": list(PROFILES),
                                        "reason": "skipped on the interpreter"})
    (s / "gate-summary.json").write_text(json.dumps(doc))
    _refused(*_merge(capsys, shards, "--out", tmp_path / "m"), f"lists case {moved} as skipped")


def test_a_profile_section_emptied_is_refused(good, tmp_path, capsys):
    """One profile of a shard said to have judged nothing, exit 0: the merge had judged bf16 on half the cases."""
    shards = _copy(good, tmp_path / "shards")
    s = shards[1]
    doc = json.loads((s / "gate-summary.json").read_text())
    doc["profiles"]["bf16"].update(totals={}, failures=[], exit_code=0, verdict="conforms")
    (s / "gate-summary.json").write_text(json.dumps(doc))
    _refused(*_merge(capsys, shards, "--out", tmp_path / "m"), "selects 2 case(s), its summary holds 0 in profile "
             "bf16")


def test_the_suite_the_shards_name_is_the_one_judged_against(good, tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    (other / "manifest.json").write_text((DEFAULT_DIR / "manifest.json").read_text() + "\n")  # another sha256
    _refused(*_merge(capsys, good, "--out", tmp_path / "m", "--fixtures", other),
             "expected the fixture suite the shards were judged against", "pass --fixtures DIR")
    _refused(*_merge(capsys, good, "--out", tmp_path / "m", "--fixtures-sha256", "0" * 64),
             "--fixtures-sha256 pins the manifest")
    assert not (tmp_path / "m").exists()


def test_a_shards_own_verdict_is_not_its_word(broken, tmp_path, capsys):
    """The merged list of shards showed each shard's gate-summary verdict as written: one edited to
    "conforms" was printed so beside a merged "does not conform"."""
    shards = _copy(broken, tmp_path / "shards")
    doc = json.loads((shards[0] / "gate-summary.json").read_text())
    doc.update(verdict="conforms", exit_code=0, reason=None)
    (shards[0] / "gate-summary.json").write_text(json.dumps(doc))
    capsys.readouterr()
    code = main(["gate", "--merge", *map(str, shards), "--out", str(tmp_path / "m"), "--json"])
    out = capsys.readouterr()
    assert code == 1, out.err
    merged = json.loads(out.out)["merged"]
    assert [(m["shard"], m["verdict"], m["exit_code"]) for m in merged] == [("0/2", "does not conform", 1),
                                                                            ("1/2", "does not conform", 1)]
    assert "merged 2 shard(s): 0/2 does not conform, 1/2 does not conform" in out.err


def test_a_merge_into_a_folder_another_gate_writes_is_refused(good, tmp_path, capsys):
    from gdncheck.untrusted import folder_lock

    out = tmp_path / "m"
    with folder_lock(out, command="the other gate"):
        before = _tree(tmp_path)
        _refused(*_merge(capsys, good, "--out", out), "the other gate", str(out))
        assert _tree(tmp_path) == before
