"""verify --names: a port that writes the names it already dumps (its layouts, its concatenations) is
judged exactly as if it had written the canonical names; what a table cannot compare is said, and an
unknown name is reported."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gdncheck.conformance.judge.aliases import NAMES_DIR, builtin_tables, load_names
from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.ports.run import run_impl
from gdncheck.fixtures.manifest import FixtureError
from gdncheck.safetensors_io import SafetensorsFile, write_safetensors

CASES = ["snapshot-replay", "prefill-decode_T65"]


def _flat(a):
    return a.reshape(a.shape[0], a.shape[1], -1)


def to_metrale(t: dict) -> dict:
    out = {"gdn_x_norm": t["x_norm"], "L00_qkvz_preconv": np.concatenate([t["qkv"], _flat(t["z"])], -1),
           "dt_raw": t["a"], "b_raw": t["b"], "post_conv": t["qkv_conv"],
           "gdn_qkv_smooth": np.concatenate([_flat(t["q"]), _flat(t["k"]), _flat(t["v"])], -1),
           "gates": np.concatenate([np.exp(t["g"]), t["beta"]], -1), "gdn_y": t["core"], "L0.gnorm": t["core_gated"],
           "gdn_out": t["attn_out"], "gdn_x_resid": t["h"], "h_norm": t["h_norm"], "mlp_out": t["mlp_out"],
           "gdn_x_final": t["out"], "conv1d_state": t["conv_state"], "gdn_state": t["recurrent_state"]}
    return out


def to_doppler(t: dict) -> dict:
    return {"L0.post_input_norm": t["x_norm"], "linear_qkv_proj": t["qkv"], "linear_z_proj": _flat(t["z"]),
            "linear_a_proj": t["a"], "linear_b_proj": t["b"], "L0.linear_conv_out": t["qkv_conv"],
            "linear_core_out": _flat(t["core_gated"]), "layer.0.attention.output": t["attn_out"], "post_attn": t["h"],
            "layer.0.ffn.output": t["mlp_out"], "layer_out": t["out"], "convState": t["conv_state"],
            "L0.linear_recurrent_state": t["recurrent_state"]}


def to_hf(t: dict) -> dict:
    B, T, Hv, dv = t["core_gated"].shape
    p = "model.layers.0."
    return {p + "input_layernorm": t["x_norm"], p + "linear_attn.in_proj_qkv": t["qkv"],
            p + "linear_attn.in_proj_z": _flat(t["z"]), p + "linear_attn.in_proj_a": t["a"],
            p + "linear_attn.in_proj_b": t["b"], "causal_conv1d_fn": np.swapaxes(t["qkv_conv"], 1, 2),
            "torch_chunk_gated_delta_rule": t["core"], p + "linear_attn.norm": t["core_gated"].reshape(B * T * Hv, dv),
            p + "linear_attn.out_proj": t["attn_out"], p + "post_attention_layernorm.input": t["h"],
            p + "post_attention_layernorm": t["h_norm"], p + "mlp": t["mlp_out"], "hidden_states": t["out"],
            "conv_states": t["conv_state"], "recurrent_states": t["recurrent_state"]}


CONVERT = {"metrale": to_metrale, "doppler": to_doppler, "hf": to_hf}
SNAPSHOT_NAMES = {"metrale": ("conv1d_state", "h_state"), "doppler": ("convState", "recurrentState"),
                  "hf": ("conv_states", "recurrent_states")}


def rename_outputs(src: Path, dst: Path, port: str) -> None:
    """Rewrite canonical outputs (and snapshot files) under ``port``'s names and layouts."""
    dst.mkdir()
    for path in src.glob("*.safetensors"):
        f = SafetensorsFile(path)
        tensors = {k: f.read(k) for k in f}
        if f.metadata.get("format") != "gdncheck-outputs":  # a snapshot file
            conv, rec = SNAPSHOT_NAMES[port]
            tensors = {conv: tensors["conv_state"], rec: tensors["recurrent_state"], "seq_len": tensors["seq_len"]}
        else:
            calls = sorted({k.split(".")[1] for k in tensors}, key=int)
            renamed = {}
            for c in calls:
                per = {k.split(".", 2)[2]: v for k, v in tensors.items() if k.startswith(f"calls.{c}.")}
                renamed.update({f"calls.{c}.{n}": v for n, v in CONVERT[port](per).items()})
                renamed[f"calls.{c}.seq_len"] = per["seq_len"]
            tensors = renamed
        write_safetensors(dst / path.name, {k: np.ascontiguousarray(v) for k, v in tensors.items()}, f.metadata)


@pytest.fixture(scope="module")
def canonical(fixtures_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("canonical")
    run_impl("reference", fixtures_dir, out, "f32", cases=CASES)
    return out


def _records(summary):
    return {(c.id, r.step, r.call, r.tensor): r for c in summary.cases for r in c.records}


@pytest.mark.parametrize("port", ["metrale", "doppler", "hf"])
def test_port_names_verify_like_the_canonical_ones(fixtures_dir, canonical, tmp_path, port):
    rename_outputs(canonical, tmp_path / port, port)
    ref = verify(fixtures_dir, canonical, "f32", cases=CASES)
    got = verify(fixtures_dir, tmp_path / port, "f32", cases=CASES, names=port)
    assert ref.exit_code == got.exit_code == 0
    table = load_names(port)
    a, b = _records(ref), _records(got)
    assert a.keys() == b.keys()
    missing = {k[3] for k, r in b.items() if r.verdict == "missing"}
    for key, r in a.items():
        if key[3] in missing:
            continue
        assert b[key].verdict == r.verdict == "pass" and b[key].metrics == r.metrics, key
    # what the port does not expose, or exposes in a form that is not ours, is missing, nothing else
    not_compared = {"metrale": {"g"}, "doppler": set(), "hf": set()}[port]
    assert missing == set(table.not_exposed) - _written(port) | not_compared
    assert got.outputs["names"].endswith(f"{port}.json")
    notes = [n for c in got.cases for n in c.notes]
    assert all("unknown" not in n for n in notes)
    if port == "metrale":
        assert any("gates" in n and "exp(g)" in n for n in notes)
    saved = [r for c in got.cases for r in c.records if r.op == "save"]
    assert len(saved) == 2 and all(r.verdict == "pass" for r in saved)
    assert {r.actual_ref["port_key"] for r in saved} == set(SNAPSHOT_NAMES[port])
    assert all(r.actual_ref["names"] == got.outputs["names"] for r in saved)


def _written(port: str) -> set[str]:
    """The canonical tensors the test's converter still writes although the table lists them as not
    exposed (a port may add canonical names to its own)."""
    return {"metrale": {"z", "a", "b", "h_norm", "mlp_out", "core_gated"}, "doppler": {"mlp_out"}, "hf": set()}[port]


def test_unknown_names_and_tables_are_reported(fixtures_dir, canonical, tmp_path):
    rename_outputs(canonical, tmp_path / "m", "metrale")
    s = verify(fixtures_dir, tmp_path / "m", "f32", cases=["prefill-decode_T65"])  # forgot --names
    (case,) = s.cases
    assert case.status == "fail" and any("gdn_x_norm" in n and "--names" in n for n in case.notes)
    f = tmp_path / "m" / "prefill-decode_T65_Hk2_Hv6_dk16_dv16_s0.safetensors"
    data = SafetensorsFile(f)
    tensors = {k: data.read(k) for k in data}
    tensors["calls.0.gdn_mystery"] = tensors["calls.0.gdn_y"]
    write_safetensors(f, tensors, data.metadata)
    s = verify(fixtures_dir, tmp_path / "m", "f32", cases=["prefill-decode_T65"], names="metrale")
    (case,) = s.cases
    assert case.status == "pass"
    assert any("unknown tensor name(s) ignored" in n and "gdn_mystery" in n and "metrale" in n for n in case.notes)
    with pytest.raises(FixtureError, match="unknown name table 'vllm'.*doppler, hf, metrale"):
        verify(fixtures_dir, tmp_path / "m", "f32", names="vllm")


def test_every_table_is_well_formed():
    assert builtin_tables() == ["doppler", "hf", "metrale"]
    for port in builtin_tables():
        table = load_names(port)  # checks every target is a stage tensor
        doc = json.loads((NAMES_DIR / f"{port}.json").read_text())
        assert doc["port"] == port and table.not_exposed
        for entry in doc["tensors"].values():
            assert sum(k in entry for k in ("as", "split", "not_comparable")) == 1
            assert "note" not in entry or isinstance(entry["note"], str)


def test_a_name_table_problem_is_a_name_table_error_and_still_a_fixture_error(tmp_path):
    from gdncheck.conformance.judge.aliases import NameTableError
    from gdncheck.errors import error_class_for_code

    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"format": "gdncheck-names", "version": 1, "tensors": {"y": {"as": "nope"}}}))
    for spec in ("vllm", str(bad)):
        with pytest.raises(NameTableError) as err:
            load_names(spec)
        assert isinstance(err.value, FixtureError) and err.value.code == "name_table"
    assert error_class_for_code("name_table") is NameTableError
