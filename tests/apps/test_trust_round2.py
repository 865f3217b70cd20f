"""Trust, second round (issue 26): nothing after a verdict can crash on a bad string, and every read of a
port's file is bounded by its header, in every step.

Each test failed on the main before the change (the surrogate: ``report`` ended in "internal error:
UnicodeEncodeError"; the declared-huge tensor: the likely-cause step read the whole of it).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

from gdncheck.untrusted import loads_untrusted, no_surrogates, safe_text
from tests.fixtures.outputs import case_entry, perfect_outputs

GDNCHECK = [sys.executable, "-m", "gdncheck"]
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1")
LONE = "\udc80"


def _cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([*GDNCHECK, *map(str, args)], capture_output=True, env=ENV, cwd=cwd)


def test_loads_untrusted_frees_every_string_of_lone_surrogates():
    doc = loads_untrusted(b'{"a\\udc80": ["x\\ud800y", {"k": "\\udfff"}], "n": 1}')
    assert doc == {"a\ufffd": ["x\ufffdy", {"k": "\ufffd"}], "n": 1}
    assert no_surrogates("plain") == "plain"
    assert safe_text("a" + LONE) == "a\\udc80"  # an in-memory string escapes, as a control does
    json.dumps(doc, ensure_ascii=False).encode("utf-8")  # writable as UTF-8


def test_a_lone_surrogate_in_an_outputs_file_never_ends_the_run(fixtures_dir, tmp_path):
    """In the implementation name and in a tensor name: verify, its JUnit and the report all finish,
    with the verdict they must give (the extra tensor is noted, the case conforms)."""
    def extra(t):
        t["calls.0.core" + LONE] = t["calls.0.core"]

    perfect_outputs(fixtures_dir, "decode_T12", tmp_path, alter=extra, meta={"implementation": "evil" + LONE + "port"})
    r = _cli("verify", "--outputs", tmp_path, "--profile", "f32", "--case", "decode_T12", "--junit", tmp_path / "j.xml")
    out = r.stdout.decode("utf-8")  # strict: no raw surrogate byte was printed
    assert r.returncode == 0 and "conforms" in out, (out, r.stderr)
    assert "evil\ufffdport" in out
    doc = json.loads((tmp_path / "verify-summary-f32.json").read_text(encoding="utf-8"))
    assert doc["exit_code"] == 0 and doc["implementation"]["name"] == "evil\ufffdport"
    (tmp_path / "j.xml").read_text(encoding="utf-8")
    r = _cli("report", tmp_path / "verify-summary-f32.json", "--out", tmp_path / "rep")
    assert r.returncode == 0, r.stderr.decode("utf-8", "replace")
    assert "evil\ufffdport" in (tmp_path / "rep" / "index.html").read_text(encoding="utf-8")


def _huge_tensor_outputs(fixtures_dir, out: Path, key: str, shape: list[int]) -> Path:
    """A valid outputs file for decode_T12 whose ``key`` declares ``shape`` (gigabytes) over a sparse
    tail: the file's size covers it, its disk use does not."""
    path = perfect_outputs(fixtures_dir, "decode_T12", out)
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    raw = path.read_bytes()
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    end = len(data)
    size = int(np.prod(shape)) * 4
    header[key] = {"dtype": "F32", "shape": shape, "data_offsets": [end, end + size]}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text + data)
        fh.truncate(8 + len(text) + end + size)
    return path


def test_a_tensor_declared_huge_is_never_read_by_the_diagnosis_or_the_report(fixtures_dir, tmp_path):
    """``calls.0.core`` declared [1, 12, 4, 16 · 2^20] (3 GiB): verify fails it on its shape from the
    header, and neither the likely-cause step nor the report reads it (peak memory stays far below)."""
    entry = case_entry(fixtures_dir, "decode_T12")
    assert entry["id"].startswith("decode_T12")
    _huge_tensor_outputs(fixtures_dir, tmp_path, "calls.0.core", [1, 12, 4, 16 * 2**20])
    code = ("import resource, sys; from gdncheck.cli import main; rc = main(sys.argv[1:]); "
            "print('maxrss_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code, "verify", "--outputs", str(tmp_path), "--profile", "f32",
                        "--case", "decode_T12", "--report", str(tmp_path / "rep")], capture_output=True, env=ENV)
    out = r.stdout.decode("utf-8", "replace")
    assert r.returncode == 1, (out, r.stderr.decode("utf-8", "replace"))
    assert "shape" in out and "Traceback" not in out + r.stderr.decode("utf-8", "replace")
    rss_mb = int(out.rsplit("maxrss_kb", 1)[1].split()[0]) / 1024
    # the process alone (numpy, the judge, the report) peaks near 1 GB here; reading the 3 GiB tensor
    # would take it past 3 GB
    assert rss_mb < 2048, f"peak memory {rss_mb:.0f} MB: the declared 3 GiB tensor was read"


def test_a_tampered_suite_says_its_goldens_do_not_reproduce(fixtures_dir, tmp_path):
    """Weights of a case changed and the manifest's sha256 recomputed: the case files match the manifest,
    a correct port fails, and before this the likely cause blamed it ('head grouping tiled'). Now the case
    and the summary say the golden does not reproduce from its recipe, and no bug class is named."""
    import hashlib
    import shutil

    from gdncheck.conformance.judge.verify import verify
    from gdncheck.conformance.ports.run import run_impl
    from gdncheck.safetensors_io import SafetensorsFile, write_safetensors

    fx = tmp_path / "fx"
    shutil.copytree(fixtures_dir, fx)
    manifest = json.loads((fx / "manifest.json").read_text())
    entry = next(c for c in manifest["cases"] if c["id"].startswith("decode_T12"))
    path = fx / entry["file"]
    f = SafetensorsFile(path)
    tensors = {k: np.array(f.read(k)) for k in f}
    dtypes = {k: f.dtype_of(k) for k in f}
    key = "weights.linear_attn.A_log"
    tensors[key] = (tensors[key].astype(np.float32) * 2.0).astype(tensors[key].dtype)  # exact in bf16 too
    meta = dict(f.metadata)
    del f
    write_safetensors(path, tensors, meta, dtypes)
    entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    entry["bytes"] = path.stat().st_size
    (fx / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    run_impl("reference", fx, tmp_path / "out", "f32", cases=["decode_T12", "prefill_T1_"])
    from gdncheck.conformance.meta.catalogue import mutant_diagnoser

    s = verify(fx, tmp_path / "out", "f32", cases=["decode_T12", "prefill_T1_"], diagnose=mutant_diagnoser(fx))
    by = {c.id.split("_")[0]: c for c in s.cases}
    assert by["prefill"].status == "pass"
    case = by["decode"]
    assert case.status == "fail"
    assert any("does not reproduce from its recipe" in n for n in case.notes), case.notes
    assert "does not reproduce" in case.diagnosis["text"] and case.diagnosis["verdict"] == "none"
    assert any("goldens do not reproduce" in n for n in s.notes)


def test_report_markdown_never_appends_through_a_link(fixtures_dir, tmp_path):
    """``report --markdown LINK`` appended to the link's target; now it is exit 2, one line, the target as
    it was. A regular file is appended to (a CI job summary)."""
    perfect_outputs(fixtures_dir, "decode_T12", tmp_path / "out")
    assert _cli("verify", "--outputs", tmp_path / "out", "--profile", "f32", "--case", "decode_T12").returncode == 0
    summary = tmp_path / "out" / "verify-summary-f32.json"
    target = tmp_path / "elsewhere.txt"
    target.write_text("precious\n")
    link = tmp_path / "summary.md"
    link.symlink_to(target)
    r = _cli("report", summary, "--markdown", link)
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == 2 and "symbolic link" in err and len(err.strip().splitlines()) == 1, err
    assert target.read_text() == "precious\n"
    real = tmp_path / "job-summary.md"
    real.write_text("before\n")
    assert _cli("report", summary, "--markdown", real).returncode == 0
    assert real.read_text().startswith("before\n") and len(real.read_text()) > 20
