"""A port that writes its engine's own tensor names (``verify --names TABLE``) gets the report a port
with the canonical names gets (issue 37, item 12): every plot, the worst elements, the tensor found in
its file, and a repro line that names the table and, run as printed, reproduces the same failure.

The port here is the reference's outputs with three errors put in, then written under the names of a
table of our own (a path, not a packaged table) that uses every conversion of docs/names.md: a plain
rename, a transpose, split parts, and reshapes of flat rows, on stage tensors and on snapshot files.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from gdncheck.cli import main
from gdncheck.conformance.ports.run import run_impl
from gdncheck.fixtures.manifest import DEFAULT_DIR
from gdncheck.safetensors_io import SafetensorsFile, write_safetensors

CASES = ["prefill-decode_T65", "snapshot-replay"]
FAILING = "prefill-decode_T65_Hk2_Hv6_dk16_dv16_s0"
SNAPSHOT_CASE = "snapshot-replay_T33_Hk2_Hv4_dk16_dv16_s0"

#: a port written in another language: its names, its layouts (docs/names.md's forms, each used)
TABLE = {
    "format": "gdncheck-names", "version": 1, "port": "rustport",
    "description": "a test port: every conversion of docs/names.md",
    "prefixes": [r"^layers\.\d+\."],
    "tensors": {
        "attn_norm": {"as": "x_norm"},
        "qkvz": {"split": [{"as": "qkv", "width": "conv_dim"}, {"as": "z", "width": "value_dim"}]},
        "ab": {"split": [{"as": "a", "width": "Hv"}, {"as": "b", "width": "Hv"}]},
        "conv_out_t": {"as": "qkv_conv", "transpose": [0, 2, 1]},
        "qkv_normed": {"split": [{"as": "q", "width": "key_dim"}, {"as": "k", "width": "key_dim"},
                                 {"as": "v", "width": "value_dim"}]},
        "gates": {"split": [{"as": "g", "width": "Hv"}, {"as": "beta", "width": "Hv"}]},
        "core_flat": {"as": "core"},
        "gated_rows": {"as": "core_gated"},
        "attn.out": {"as": "attn_out"},
        "resid": {"as": "h"},
        "ffn_norm": {"as": "h_norm"},
        "ffn": {"as": "mlp_out"},
        "layer_out": {"as": "out"},
        "conv_cache": {"as": "conv_state"},
        "ssm_state": {"as": "recurrent_state"},
    },
    "not_exposed": {},
}


def _flat(a):
    return a.reshape(a.shape[0], a.shape[1], -1)


def to_port(t: dict) -> dict:
    """One call's canonical tensors under the port's names and layouts."""
    B, T, Hv, dv = t["core_gated"].shape
    p = "layers.0."
    return {p + "attn_norm": t["x_norm"], "qkvz": np.concatenate([t["qkv"], _flat(t["z"])], -1),
            "ab": np.concatenate([t["a"], t["b"]], -1), p + "conv_out_t": np.swapaxes(t["qkv_conv"], 1, 2),
            "qkv_normed": np.concatenate([_flat(t["q"]), _flat(t["k"]), _flat(t["v"])], -1),
            "gates": np.concatenate([t["g"], t["beta"]], -1), "core_flat": _flat(t["core"]),
            "gated_rows": t["core_gated"].reshape(B * T * Hv, dv), p + "attn.out": t["attn_out"], "resid": t["h"],
            "ffn_norm": t["h_norm"], "ffn": t["mlp_out"], "layer_out": t["out"], "conv_cache": t["conv_state"],
            "ssm_state": t["recurrent_state"], "seq_len": t["seq_len"]}


def rename(src: Path, dst: Path) -> None:
    dst.mkdir()
    for path in src.glob("*.safetensors"):
        f = SafetensorsFile(path)
        tensors = {k: f.read(k) for k in f}
        if f.metadata.get("format") != "gdncheck-outputs":  # a snapshot file
            tensors = {"conv_cache": tensors["conv_state"], "ssm_state": tensors["recurrent_state"],
                       "seq_len": tensors["seq_len"]}
        else:
            renamed = {}
            for c in sorted({k.split(".")[1] for k in tensors}, key=int):
                per = {k.split(".", 2)[2]: v for k, v in tensors.items() if k.startswith(f"calls.{c}.")}
                renamed.update({f"calls.{c}.{n}": v for n, v in to_port(per).items()})
            tensors = renamed
        write_safetensors(dst / path.name, {k: np.ascontiguousarray(v) for k, v in tensors.items()}, f.metadata)


def _bump(path: Path, edits: dict) -> None:
    f = SafetensorsFile(path)
    tensors = {k: f.read(k) for k in f}
    for key, (index, delta) in edits.items():
        a = tensors[key].copy()
        a[index] += delta
        tensors[key] = a
    write_safetensors(path, tensors, f.metadata)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both ports judged with --report from one folder (relative paths, as a person types them)."""
    base = tmp_path_factory.mktemp("names-report")
    canon = base / "canon"
    run_impl("reference", DEFAULT_DIR, canon, "f32", cases=CASES)
    # three errors: q (a split part reshaped), attn_out (a plain rename: the tensor), and the
    # recurrent state (both in the call and in the snapshot file the case saves)
    _bump(canon / f"{FAILING}.safetensors", {"calls.1.q": ((0, 0, 1, 3), 0.01), "calls.1.attn_out": ((0, 0, 5), 0.05),
                                              "calls.1.recurrent_state": ((1, 2, 3, 4), 0.02)})
    snap = next(canon.glob(f"{SNAPSHOT_CASE}*.snapshot.safetensors"))
    _bump(snap, {"recurrent_state": ((0, 1, 2, 3), 0.03)})
    rename(canon, base / "port")
    (base / "rustport.json").write_text(json.dumps(TABLE))
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(base)
        for name, extra in (("canon", []), ("port", ["--names", "rustport.json"])):
            code = main(["verify", "--outputs", name, "--profile", "f32", *[a for c in CASES for a in ("--case", c)],
                         "--summary", f"{name}.json", "--report", f"report-{name}", "--diagnose", "0", "-q", *extra])
            out[name] = (code, json.loads((base / f"{name}.json").read_text()))
    return base, out


def _page(base: Path, name: str, case: str) -> str:
    return (base / f"report-{name}" / "cases" / f"{case}.html").read_text()


def _worst_tables(html: str) -> list[str]:
    return re.findall(r"<table[^>]*>\s*<thead><tr><th class=\"l\">worst elements.*?</table>", html, re.S)


def test_the_port_is_judged_as_the_canonical_one(runs):
    base, out = runs
    (ca, canon), (po, port) = out["canon"], out["port"]
    assert ca == po == 1
    assert [c["status"] for c in canon["cases"]] == [c["status"] for c in port["cases"]] == ["fail", "fail"]
    assert canon["totals"] == port["totals"] and canon["totals"]["records_missing"] == 0
    for a, b in zip(canon["cases"], port["cases"]):
        assert a["first_divergence"] == b["first_divergence"]
        assert [(r["tensor"], r["verdict"], r["metrics"]) for r in a["records"]] == \
            [(r["tensor"], r["verdict"], r["metrics"]) for r in b["records"]]
    refs = [r["actual_ref"] for c in port["cases"] for r in c["records"] if r["verdict"] == "fail"]
    assert {r["port_key"] for r in refs} >= {"calls.1.qkv_normed", "calls.1.layers.0.attn.out", "calls.1.ssm_state",
                                             "ssm_state"}


def test_every_plot_and_worst_table_of_the_canonical_report(runs):
    base, _ = runs
    for case in (FAILING, SNAPSHOT_CASE):
        a, b = _page(base, "canon", case), _page(base, "port", case)
        assert "has no tensor" not in b and "not read" not in b
        # the same plots: heatmap PNGs (byte for byte: the same errors), inline SVGs, histograms
        pngs = sorted(p.name for p in (base / "report-canon" / "cases" / case).glob("*.png"))
        assert pngs and pngs == sorted(p.name for p in (base / "report-port" / "cases" / case).glob("*.png"))
        for name in pngs:
            assert (base / "report-canon" / "cases" / case / name).read_bytes() == \
                (base / "report-port" / "cases" / case / name).read_bytes()
        assert a.count("<svg") == b.count("<svg") > 0 and a.count("<img") == b.count("<img") > 0
        assert a.count("histogram") == b.count("histogram") > 0
        # the same worst elements, value for value
        assert _worst_tables(a) and _worst_tables(a) == _worst_tables(b)
    page = _page(base, "port", FAILING)
    assert "as <span class=\"mono\">calls.1.layers.0.attn.out</span>" in page  # the name it was found under
    assert "as <span class=\"mono\">calls.1.qkv_normed</span>" in page


def test_the_pages_differ_only_where_they_name_the_port(runs):
    base, _ = runs
    for case in (FAILING, SNAPSHOT_CASE):
        a, b = _page(base, "canon", case), _page(base, "port", case)
        b = re.sub(r" as <span class=\"mono\">[^<]*</span>", "", b)
        b = re.sub(r" · <span title=\"[^\"]*\">names read through [^<]*</span></nav>", "</nav>", b)
        a, b = (re.sub(r"<pre>gdncheck .*?</pre>", "<pre/>", x, flags=re.S) for x in (a, b))
        a, b = (x.replace("canon", "OUT").replace("port", "OUT") for x in (a, b))
        assert a == b


def test_the_repro_names_the_table_and_reproduces(runs, monkeypatch, capsys):
    base, out = runs
    case = next(c for c in out["port"][1]["cases"] if c["id"] == FAILING)
    page = _page(base, "port", FAILING)
    shown = re.search(r"<pre>(gdncheck .*?)</pre>", page, re.S).group(1).replace("&amp;", "&")
    assert shown == case["repro"]
    verify = shlex.split(case["repro"].split(" && ")[-1])
    assert verify[verify.index("--names") + 1] == "rustport.json"
    monkeypatch.chdir(base)
    assert main([*verify[1:], "--summary", "again.json", "--diagnose", "0", "-q"]) == 1
    again = json.loads((base / "again.json").read_text())
    (c,) = again["cases"]
    assert c["id"] == FAILING and c["first_divergence"] == case["first_divergence"]
    assert c["message"] == case["message"]


def test_a_summary_conversion_is_checked_before_anything_is_read(tmp_path):
    """The summary is untrusted: a ``convert`` verify never writes, or one that would read a port tensor
    far larger than the tensor judged, is a note; a good one gives the slice verify judged."""
    from gdncheck.reports.tensors import CaseFiles

    data = np.arange(24, dtype=np.float32).reshape(1, 4, 6)
    write_safetensors(tmp_path / "o.safetensors", {"qkv_normed": data, "big": np.zeros((1, 4, 1000), np.float32)},
                      {})
    files = CaseFiles(None, tmp_path)
    ref = {"file": str(tmp_path / "o.safetensors"), "key": "calls.0.q", "port_key": "qkv_normed",
           "convert": {"transpose": None, "slice": [2, 4], "total": 6}}
    arr, note = files.read("actual", ref, [1, 4, 2])
    assert note is None and np.array_equal(arr, data[..., 2:4])
    arr, note = files.read("actual", {**ref, "convert": {"transpose": [0, 0, 1], "slice": None, "total": None}},
                           [1, 4, 2])
    assert arr is None and "not one verify writes" in note
    arr, note = files.read("actual", {**ref, "convert": {"transpose": None, "slice": [4, 9], "total": 6}}, [1, 4, 2])
    assert arr is None and "not one verify writes" in note  # a slice outside its whole
    arr, note = files.read("actual", {**ref, "port_key": "big", "convert": {"transpose": None, "slice": [0, 2],
                                                                          "total": 1000}}, [1, 4, 2])
    assert arr is None and "more than 64 times" in note
    old = {k: v for k, v in ref.items() if k != "convert"}  # a summary written before the conversion was
    arr, note = files.read("actual", old, [1, 4, 2])
    assert arr is None and "verify again" in note
    arr, note = files.read("actual", {**ref, "port_key": "gone"}, [1, 4, 2])
    assert arr is None and "has no tensor gone (read as calls.0.q" in note
