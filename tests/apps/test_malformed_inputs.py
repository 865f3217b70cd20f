"""Malformed input (issue 11, items 5 and 6): every class gets exit 2 and one line naming the file (and
case, tensor, key) with what was expected and what was found; never a traceback, never exit 1. One
unusable case never stops the others; sizes are checked before anything is read or allocated."""

from __future__ import annotations

import json
import struct
import tracemalloc

import pytest

from gdncheck.cli import main
from gdncheck.conformance.judge.verify import verify
from tests.fixtures.outputs import perfect_outputs
from tests.helpers import default_case_id

GOOD, BAD = "prefill_T1_", "decode_T12"
GOOD_ID, BAD_ID = default_case_id("prefill"), default_case_id("decode")


def _header(path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def _write_header(path, header, body: bytes | None = None, raw: bytes | None = None) -> None:
    text = raw if raw is not None else json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + (body or b""))


def _verify_cli(out, capsys, *extra) -> tuple[int, str, str]:
    code = main(["verify", "--outputs", str(out), "--profile", "f32", "--case", GOOD, "--case", BAD, *extra])
    cap = capsys.readouterr()
    assert "Traceback" not in cap.out + cap.err
    return code, cap.out, cap.err


def _first_tensor(header: dict) -> str:
    return next(k for k in sorted(header) if k != "__metadata__")


@pytest.mark.parametrize("damage", ["dtype_list", "shape_huge", "deep_json", "offsets_out", "shape_str", "dup_keys",
                                    "format_version_missing", "format_version_unknown", "error_step_junk",
                                    "na_step_past_program", "both_error_and_na", "mode_unknown"])
def test_a_damaged_outputs_file_is_one_unusable_case(fixtures_dir, tmp_path, capsys, damage):
    perfect_outputs(fixtures_dir, GOOD, tmp_path)
    bad = perfect_outputs(fixtures_dir, BAD, tmp_path)
    header, body = _header(bad)
    key = _first_tensor(header)
    meta = header["__metadata__"]
    raw = None
    if damage == "dtype_list":
        header[key]["dtype"] = ["F32"]
    elif damage == "shape_huge":
        header[key]["shape"] = [10 ** 30, 1]
    elif damage == "deep_json":
        raw = b'{"a": ' + b"[" * 100000 + b"]" * 100000 + b"}"
    elif damage == "offsets_out":
        header[key]["data_offsets"] = [0, 10 ** 12]
    elif damage == "shape_str":
        header[key]["shape"] = "3,4"
    elif damage == "dup_keys":
        again = b', "' + key.encode() + b'": ' + json.dumps(header[key]).encode()
        raw = json.dumps(header).encode()[:-1] + again + b"}"
    elif damage == "format_version_missing":
        del meta["format_version"]
    elif damage == "format_version_unknown":
        meta["format_version"] = "99"
    elif damage == "error_step_junk":
        meta.update(error_code="input_error", error_message="x", error_step="one")
    elif damage == "na_step_past_program":
        meta.update(not_applicable="cannot", not_applicable_step="99")
    elif damage == "both_error_and_na":
        meta.update(error_code="input_error", error_step="1", not_applicable="cannot", not_applicable_step="1")
    elif damage == "mode_unknown":
        meta["mode"] = "quantum"
    _write_header(bad, header, body, raw)
    code, out, _ = _verify_cli(tmp_path, capsys)
    assert code == 2, out
    assert f"pass  {GOOD_ID}" in out  # the other case is still judged
    line = next(x for x in out.splitlines() if x.startswith(f"ERROR {BAD_ID}"))
    assert "outputs unusable" in line and "expected" in line and "found" in line, line
    summary = json.loads((tmp_path / "verify-summary-f32.json").read_text())
    assert summary["exit_code"] == 2 and summary["verdict"] == "inputs unusable"


def _manifest_damage(fixture_copy, prefix: str, change) -> None:
    path = fixture_copy / "manifest.json"
    doc = json.loads(path.read_text())
    change(next(c for c in doc["cases"] if c["id"].startswith(prefix)))
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("damage", [
    ("error-head-ratio", lambda c: c.update(expected_error=None), "expected_error is null"),
    ("error-head-ratio", lambda c: c["expected_error"].update(step=7), "past the program"),
    ("decode_T12", lambda c: c["program"][1].update(seq_pos=[0, 0]), "seq_pos has 2 entries"),
    ("decode_T12", lambda c: c["program"][1].update(call=3), "expected call 0"),
    ("decode_T12", lambda c: c.update(batch=10 ** 9), "bound"),
    ("decode_T12", lambda c: c["config"].update(linear_key_head_dim=8192), "at most 4096"),
    ("decode_T12", lambda c: c["config"].update(linear_num_value_heads=64, linear_num_key_heads=64,
                                                linear_key_head_dim=4096, linear_value_head_dim=4096), "bound"),
    ("decode_T12", lambda c: c["config"].update(hidden_size=float("inf")), "hidden_size"),
    ("snapshot-replay", lambda c: c["program"].insert(2, {"op": "restore", "slot": "nowhere"}), "no snapshot"),
    ("decode_T12", lambda c: c.update(kind="error"), "expected_error is null"),
])
def test_an_inconsistent_manifest_entry_is_one_unusable_case(fixtures_dir, fixture_copy, tmp_path, capsys, damage):
    prefix, change, words = damage
    _manifest_damage(fixture_copy, prefix, change)
    perfect_outputs(fixtures_dir, GOOD, tmp_path)
    code = main(["verify", "--fixtures", str(fixture_copy), "--outputs", str(tmp_path), "--profile", "f32", "--case",
                 GOOD, "--case", prefix])
    cap = capsys.readouterr()
    assert code == 2 and "Traceback" not in cap.out + cap.err
    assert f"pass  {GOOD_ID}" in cap.out
    line = next(x for x in cap.out.splitlines() if x.startswith(f"ERROR {prefix}"))
    assert "inconsistent" in line and words in line, line
    code = main(["run", "reference", "--fixtures", str(fixture_copy), "--out", str(tmp_path / "run"), "--profile",
                 "f32", "--case", GOOD, "--case", prefix])
    cap = capsys.readouterr()
    assert code == 2 and "Traceback" not in cap.out + cap.err and f"ran      {GOOD_ID}" in cap.out


def test_paths_that_are_not_what_they_should_be(fixtures_dir, tmp_path, capsys):
    perfect_outputs(fixtures_dir, GOOD, tmp_path / "out")
    (tmp_path / "afile").write_text("x")
    cases = [
        ["verify", "--outputs", str(tmp_path / "out"), "--profile", "f32", "--case", GOOD, "--summary",
         str(tmp_path / "out")],
        ["verify", "--outputs", str(tmp_path / "out"), "--profile", "f32", "--case", GOOD, "--junit", str(tmp_path)],
        ["verify", "--outputs", str(tmp_path / "out"), "--profile", "f32", "--case", GOOD, "--summary",
         str(tmp_path / "afile" / "s.json")],
        ["verify", "--fixtures", str(tmp_path / "afile"), "--outputs", str(tmp_path / "out"), "--profile", "f32"],
        ["verify", "--fixtures", str(tmp_path / "nowhere"), "--outputs", str(tmp_path / "out"), "--profile", "f32"],
        ["verify", "--outputs", str(tmp_path / "out"), "--profile", "f32", "--case", GOOD, "--names",
         str(tmp_path / "afile")],
        ["run", "reference", "--out", str(tmp_path / "afile"), "--profile", "f32", "--case", GOOD],
        ["report", str(tmp_path / "out"), "-o", str(tmp_path / "site")],
        ["fixtures", "list", "--fixtures", str(tmp_path / "afile")],
        ["verify", "--outputs", str(tmp_path / "nowhere"), "--profile", "f32", "--case", GOOD],
        ["verify", "--outputs", str(tmp_path / "afile"), "--profile", "f32", "--case", GOOD],
        ["verify", "--outputs", str(tmp_path / "out"), "--profile", "f32", "--case", GOOD, "--report",
         str(tmp_path / "afile")],
    ]
    for argv in cases:
        code = main(argv)
        cap = capsys.readouterr()
        assert code == 2, (argv, cap.out, cap.err)
        assert "Traceback" not in cap.err and len(cap.err.strip().splitlines()) == 1, (argv, cap.err)
        assert not cap.out, (argv, cap.out)  # refused before anything was judged
    assert not (tmp_path / "nowhere").exists()  # a mistyped --outputs is not made to hold a summary


@pytest.mark.parametrize("spec", ["os:getcwd", "json:dumps", "tests.apps.plugins:FORGED"])
def test_a_callable_that_is_no_factory_is_a_usage_error_before_anything_runs(tmp_path, capsys, spec):
    """It ran every case, recorded each as 'raised TypeError', and exited 0."""
    code = main(["run", spec, "--out", str(tmp_path / "o"), "--profile", "f32", "--case", GOOD])
    cap = capsys.readouterr()
    assert code == 2 and len(cap.err.strip().splitlines()) == 1 and not cap.out, (cap.out, cap.err)
    assert "factory" in cap.err and not (tmp_path / "o").exists()


def test_an_unknown_option_is_a_usage_error_before_anything_runs(tmp_path, capsys):
    code = main(["run", "reference", "--out", str(tmp_path / "o"), "--profile", "f32", "--option", "nope=1"])
    assert code == 2 and "takes no option 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    from gdncheck.gate import GateOptions, run_gate

    res = run_gate(GateOptions(impl="reference", profiles=("f32",), cases=[GOOD], options={"nope": 1},
                               out=str(tmp_path / "g"), properties=False, jobs=1, rebuild_check=False))
    assert res.exit_code == 2 and "takes no option 'nope'" in res.reason and "profiles" not in res.doc


@pytest.mark.parametrize("table", [
    {"format": "gdncheck-names", "version": 1, "tensors": {"y": {"as": "core", "transpose": [0, 0, 5]}}},
    {"format": "gdncheck-names", "version": 1, "tensors": {"y": {"split": [{"as": "q", "width": -1}]}}},
    {"format": "gdncheck-names", "version": 1, "tensors": ["y"]},
    {"format": "gdncheck-names", "version": 1, "tensors": {}, "prefixes": ["("]},
    [1, 2],
])
def test_a_malformed_name_table_is_one_line(fixtures_dir, tmp_path, capsys, table):
    perfect_outputs(fixtures_dir, GOOD, tmp_path / "out")
    (tmp_path / "t.json").write_text(json.dumps(table))
    code = main(["verify", "--outputs", str(tmp_path / "out"), "--profile", "f32", "--case", GOOD, "--names",
                 str(tmp_path / "t.json")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and str(tmp_path / "t.json") in err


def _bad_out_bounds(doc: dict) -> None:
    table = doc["modes"]["end_to_end"]["f32"]
    for rows in [table["global"], *table["cases"].values()]:
        if "out" in rows:
            rows["out"]["elem"] = "big"


@pytest.mark.parametrize("change", [lambda d: d.update(version="x"), lambda d: d.update(modes=[]), _bad_out_bounds])
def test_a_malformed_tolerance_table_is_one_line(fixtures_dir, tmp_path, capsys, change):
    from gdncheck.conformance.judge.tolerances import TABLE_PATH

    doc = json.loads(TABLE_PATH.read_text())
    change(doc)
    (tmp_path / "tol.json").write_text(json.dumps(doc))
    perfect_outputs(fixtures_dir, GOOD, tmp_path / "out")
    code = main(["verify", "--outputs", str(tmp_path / "out"), "--profile", "f32", "--case", GOOD, "--tolerances",
                 str(tmp_path / "tol.json")])
    cap = capsys.readouterr()
    assert code == 2 and "Traceback" not in cap.out + cap.err and "tol.json" in cap.out + cap.err


def test_an_unexpected_exception_is_exit_2_and_one_line(monkeypatch, capsys):
    import gdncheck.commands.fixtures as fixtures_command

    def boom(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(fixtures_command, "run", boom)
    assert main(["fixtures", "list"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "gdncheck bug" in err and "GDN_DEBUG=1" in err
    monkeypatch.setenv("GDN_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        main(["fixtures", "list"])


def test_a_huge_declared_tensor_of_the_wrong_shape_is_never_read(fixtures_dir, tmp_path):
    """A sparse outputs file declaring 400 MB for `out`: a shape failure, decided from the header."""
    perfect_outputs(fixtures_dir, GOOD, tmp_path)
    path = tmp_path / f"{GOOD_ID}.safetensors"
    header, body = _header(path)
    nbytes = 100_000_000 * 4
    for k in sorted(header):
        if k != "__metadata__":
            header[k]["data_offsets"] = [0, 0]
            header[k]["shape"] = [0]
    header["calls.0.out"] = {"dtype": "F32", "shape": [1, 1, 100_000_000], "data_offsets": [0, nbytes]}
    _write_header(path, header)
    with open(path, "r+b") as fh:  # sparse: the file claims the bytes without holding them
        fh.truncate(path.stat().st_size + nbytes)
    tracemalloc.start()
    try:
        s = verify(fixtures_dir, tmp_path, "f32", cases=[GOOD])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    rec = next(r for r in s.cases[0].records if r.tensor == "out")
    assert rec.reason == "shape" and rec.shape == [1, 1, 100_000_000] and s.exit_code == 1
    assert peak < 50e6, f"{peak / 1e6:.0f} MB allocated for a tensor that was never needed"


@pytest.mark.parametrize("command", [["verify", "--profile", "f32", "--case", GOOD, "--tolerances", "{path}"],
                                     ["report", "{path}"],
                                     ["gate", "--impl", "reference", "--profiles", "f32", "--case", GOOD,
                                      "--no-properties", "--xfails", "{path}"]])
def test_a_device_given_for_a_file_is_refused_unread(fixtures_dir, tmp_path, command):
    """/dev/zero never ends: read whole it filled the memory (exit 137). In a child process with its
    address space bounded, so that a regression fails this test instead of the machine."""
    import os
    import resource
    import subprocess
    import sys

    path = tmp_path / "table"
    path.symlink_to("/dev/zero")
    perfect_outputs(fixtures_dir, GOOD, tmp_path / "out")
    argv = [a.replace("{path}", str(path)) for a in command]
    if argv[0] == "verify":
        argv += ["--outputs", str(tmp_path / "out")]
    if argv[0] == "gate":
        argv += ["--out", str(tmp_path / "gate")]

    def bound():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    p = subprocess.run([sys.executable, "-m", "gdncheck", *argv], capture_output=True, text=True, timeout=300,
                       preexec_fn=bound, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    text = p.stdout + p.stderr
    assert p.returncode == 2 and "is a device, expected a file" in text and "Traceback" not in text, text[-2000:]
    if argv[0] != "gate":  # the gate prints its could-not-run block (the reason, where the summary is)
        assert len(p.stderr.strip().splitlines()) == 1 and not p.stdout, text[-2000:]
    else:  # read before anything ran
        assert not (tmp_path / "gate" / "f32").exists() and "refusing" not in text
