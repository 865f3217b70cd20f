"""verify on bad inputs and bad outputs: verdicts, not crashes; unusable cases reported, the others
still verified; messages that stand alone and end with a repro line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gdncheck.config import GDNConfig
from gdncheck.conformance.judge.files import expected_shape
from gdncheck.conformance.judge.records import validate_summary
from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.ports.run import run_impl
from gdncheck.dtypes import round_to
from gdncheck.fixtures.manifest import FixtureError
from tests.fixtures.outputs import case_entry, perfect_outputs

SUBSET = ["decode_T12", "snapshot-replay", "prefill_T1_", "batch-positions", "error-norm-mode-conflict"]


def _verify(fx, out, cases=SUBSET, profile="f32"):
    s = verify(fx, out, profile, cases=cases)
    validate_summary(s.to_json())
    return s, {c.id.split("_")[0] if not c.id.startswith("prefill") else c.id[:11]: c for c in s.cases}


def test_golden_copies_conform_and_missing_optional_tensors_are_not_failures(fixtures_dir, tmp_path):
    perfect_outputs(fixtures_dir, "decode_T12", tmp_path)

    def only_required(t):
        for k in [k for k in t if k.split(".")[-1] not in ("out", "conv_state", "recurrent_state", "seq_len")]:
            del t[k]
    perfect_outputs(fixtures_dir, "batch-positions", tmp_path, alter=only_required)
    s = verify(fixtures_dir, tmp_path, "f32", cases=["decode_T12", "batch-positions"])
    assert s.exit_code == 0
    by = {c.id[:5]: c for c in s.cases}
    assert by["batch"].counts["missing"] == 4 * 18 - 4 * 1 and by["batch"].counts["fail"] == 0


def _one_failure(fx, out, prefix, alter=None, profile="f32", **kw):
    perfect_outputs(fx, prefix, out, alter=alter, **kw)
    s = verify(fx, out, profile, cases=[prefix])
    validate_summary(s.to_json())
    (case,) = s.cases
    assert case.status == "fail" and s.exit_code == 1
    fails = [r for r in case.records if r.verdict == "fail"]
    return case, fails


def test_shape_dtype_nan_inf_are_verdicts(fixtures_dir, tmp_path):
    def transpose_state(t):  # dk != dv: a [Hv, dv, dk] state
        t["calls.0.recurrent_state"] = np.ascontiguousarray(np.swapaxes(t["calls.0.recurrent_state"], -1, -2))
    entry = case_entry(fixtures_dir, "dk-lt-dv")
    cfg = GDNConfig.from_hf(dict(entry["config"]))
    assert cfg.head_k_dim != cfg.head_v_dim
    case, fails = _one_failure(fixtures_dir, tmp_path, "dk-lt-dv", transpose_state)
    assert [(r.tensor, r.reason) for r in fails] == [("recurrent_state", "shape")]
    assert case.first_divergence.stage == "delta_rule" and case.first_divergence.call == 0
    lead = [entry["batch"], cfg.num_v_heads]
    assert (f"shape {lead + [cfg.head_v_dim, cfg.head_k_dim]}, but should be "
            f"{lead + [cfg.head_k_dim, cfg.head_v_dim]}") in case.message

    def nan_core(t):
        t["calls.2.core"][1, 1, 0, 3] = np.nan
    case, fails = _one_failure(fixtures_dir, tmp_path, "batch-positions", nan_core)
    assert fails[0].reason == "nan" and fails[0].metrics["first_nonfinite"] == [1, 1, 0, 3]
    assert "NaN" in case.message and case.first_divergence.tensor == "core"

    def inf_out(t):
        t["calls.1.out"][0, 0, 5] = np.inf
    case, fails = _one_failure(fixtures_dir, tmp_path, "batch-positions", inf_out)
    assert fails[0].reason == "inf" and "an infinity passes only where" in case.message

    def int_out(t):
        t["calls.0.out"] = t["calls.0.out"].astype(np.int32)
    case, fails = _one_failure(fixtures_dir, tmp_path, "decode_T12", int_out)
    assert fails[0].reason == "dtype" and "dtype I32, but should be F32 or F64" in case.message
    # a bf16 recurrent state is refused in every profile; f16 activations are refused in profile bf16
    def narrow(t):
        t["calls.0.recurrent_state"] = round_to(t["calls.0.recurrent_state"], "bf16").astype(np.float32)
        t["calls.0.out"] = round_to(t["calls.0.out"], "f16").astype(np.float32)
    case, fails = _one_failure(fixtures_dir, tmp_path, "prefill_T1_", narrow, profile="bf16",
                               dtypes={"calls.0.recurrent_state": "BF16", "calls.0.out": "F16"})
    assert {(r.tensor, r.reason) for r in fails} == {("recurrent_state", "dtype"), ("out", "dtype")}


def test_bounds_messages_and_missing_required(fixtures_dir, tmp_path):
    def scale_core(t):  # a 1% error in one head of one token of the second call
        t["calls.1.core"][0, 0, 2, :] *= 1.01
    case, fails = _one_failure(fixtures_dir, tmp_path, "prefill-decode_T65", scale_core)
    (r,) = fails
    assert (r.tensor, r.call, r.reason, r.first_bad_token, r.first_bad_position) == ("core", 1, "elem_bound", 0, 61)
    dv = GDNConfig.from_hf(dict(case_entry(fixtures_dir, "prefill-decode_T65")["config"])).head_v_dim
    assert r.over_bound == dv and r.min_tolerance["elem"] > r.bound["elem"]  # the head's every element
    msg = case.message
    assert msg.startswith("core (delta_rule) of call 1: max scaled error") and ", but should be " in msg
    assert "elem bound" in msg
    assert msg.endswith("[case prefill-decode_T65_Hk2_Hv6_dk16_dv16_s0, step 2: forward seq_pos [61, 61]]")
    assert "\n" not in case.repro and case.repro.startswith("gdncheck verify --fixtures ")
    assert case.repro.endswith("--profile f32 --case prefill-decode_T65_Hk2_Hv6_dk16_dv16_s0")

    case, fails = _one_failure(fixtures_dir, tmp_path, "decode_T12", lambda t: t.pop("calls.0.out"))
    assert fails[0].reason == "missing_required" and "no tensor calls.0.out in the outputs" in case.message

    case, fails = _one_failure(fixtures_dir, tmp_path, "decode_T12",
                               lambda t: t.update({"calls.0.seq_len": np.array([11])}))
    assert fails[0].reason == "seq_len" and "seq_len [11], but should be [12]" in case.message

    # FORMAT.md §7: seq_len is I32 or I64; the right count in an unsigned byte is not a seq_len
    case, fails = _one_failure(fixtures_dir, tmp_path, "decode_T12",
                               lambda t: t.update({"calls.0.seq_len": np.array([12], np.uint8)}))
    assert fails[0].reason == "seq_len" and "of dtype U8" in case.message


def test_saved_snapshots_are_checked(fixtures_dir, tmp_path):
    entry = case_entry(fixtures_dir, "snapshot-replay")
    case, fails = _one_failure(fixtures_dir, tmp_path, "snapshot-replay")  # the program saves a file; none here
    assert {(r.tensor, r.op, r.reason) for r in fails} == {("conv_state", "save", "missing_required"),
                                                           ("recurrent_state", "save", "missing_required")}
    assert entry["program"][3]["file"] in case.message
    run_impl("reference", fixtures_dir, tmp_path / "ref", "f32", cases=["snapshot-replay"])
    s = verify(fixtures_dir, tmp_path / "ref", "f32", cases=["snapshot-replay"])
    assert s.exit_code == 0 and sum(r.op == "save" and r.verdict == "pass" for r in s.cases[0].records) == 2


def test_expected_errors(fixtures_dir, tmp_path):
    prefix = "error-norm-mode-conflict"
    case, _ = _one_failure(fixtures_dir, tmp_path, prefix)
    assert "raised nothing, but should raise norm_mode_conflict (or the more general config_error)" in case.message
    case, _ = _one_failure(fixtures_dir, tmp_path, prefix, meta={"error_code": "input_shape", "error_step": "0"})
    assert case.error_check["actual"] == "input_shape" and "but should raise norm_mode_conflict" in case.message
    perfect_outputs(fixtures_dir, prefix, tmp_path, meta={"error_code": "config_error", "error_step": "0"})
    s = verify(fixtures_dir, tmp_path, "f32", cases=[prefix])
    assert s.cases[0].status == "pass" and s.cases[0].error_check["match"] == "family"
    assert s.exit_code == 2 and s.verdict() == "nothing judged"  # an expected error alone judges no tensor (issue 37)
    # a forward case whose implementation raised
    case, _ = _one_failure(fixtures_dir, tmp_path, "decode_T12",
                           meta={"error_code": "input_dtype", "error_step": "1", "error_message": "no bf16 here"})
    assert case.first_divergence.reason == "raised" and "raised input_dtype at step 1 (decode)" in case.message


def test_unusable_inputs_are_reported_per_case(fixtures_dir, fixture_copy, tmp_path):
    out = tmp_path / "out"
    run_impl("reference", fixture_copy, out, "f32", cases=SUBSET)
    s = verify(fixture_copy, out, "f32", cases=SUBSET)
    assert s.exit_code == 0
    manifest = json.loads((fixture_copy / "manifest.json").read_text())
    ids = {c["id"][:8]: c for c in manifest["cases"] if any(c["id"].startswith(p) for p in SUBSET)}
    # 1. a truncated fixture file  2. a flipped byte (checksum)  3. a file name outside the folder
    f = fixture_copy / ids["decode_T"]["file"]
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    f = fixture_copy / ids["snapshot"]["file"]
    data = bytearray(f.read_bytes())
    data[-3] ^= 0xFF
    f.write_bytes(bytes(data))
    for c in manifest["cases"]:
        if c["id"] == ids["prefill_"]["id"]:
            c["file"] = "../" + c["file"]
    (fixture_copy / "manifest.json").write_text(json.dumps(manifest))
    # 4. an outputs file truncated  5. outputs of another fixture version
    o = out / f"{ids['batch-po']['id']}.safetensors"
    o.write_bytes(o.read_bytes()[:100])
    perfect_outputs(fixtures_dir, "error-norm-mode-conflict", out, meta={"fixture_sha256": "0" * 64})
    s = verify(fixture_copy, out, "f32", cases=SUBSET)
    validate_summary(s.to_json())
    problems = {c.id[:8]: c.problem for c in s.cases}
    assert s.exit_code == 2 and all(c.status == "error" for c in s.cases)
    assert problems["decode_T"].startswith("fixture unusable") and "bytes, but the manifest records" in \
        problems["decode_T"]  # its size is checked before it is hashed
    assert "sha256" in problems["snapshot"] and "manifest records" in problems["snapshot"]
    assert "points outside" in problems["prefill_"] or "inside" in problems["prefill_"]
    assert "outputs unusable" in problems["batch-po"]
    assert "another" in problems["error-no"] or "fixture file of sha256" in problems["error-no"]


def test_one_broken_manifest_entry_spares_the_others(fixtures_dir, fixture_copy, tmp_path):
    manifest = json.loads((fixture_copy / "manifest.json").read_text())
    broken = next(c for c in manifest["cases"] if c["id"].startswith("decode_T12"))
    del broken["sha256"]
    (fixture_copy / "manifest.json").write_text(json.dumps(manifest))
    run_impl("reference", fixtures_dir, tmp_path, "f32", cases=["decode_T12", "prefill_T1_"])
    s = verify(fixture_copy, tmp_path, "f32", cases=["decode_T12", "prefill_T1_"])
    status = {c.id[:6]: (c.status, c.problem) for c in s.cases}
    assert status["decode"][0] == "error" and "sha256" in status["decode"][1]
    assert status["prefil"] == ("pass", None) and s.exit_code == 2


def test_no_partial_files_are_left(fixtures_dir, tmp_path):
    run_impl("reference", fixtures_dir, tmp_path, "f32", cases=SUBSET)
    s = verify(fixtures_dir, tmp_path, "f32", cases=SUBSET)
    s.write(tmp_path / "summary.json")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert not [n for n in names if n.endswith(".part") or n.startswith(".")], names
    assert json.loads((tmp_path / "summary.json").read_text())["exit_code"] == 0


def test_a_sparse_case_is_judged_with_its_block_tensors(fixtures_dir, tmp_path):
    """The golden check shapes the sparse block's tensors from the case's config (router_logits
    [B, T, E], selected_experts [B, T, top_k]); selected_experts may come in any dtype holding the
    indices exactly. Once both raised StopIteration/TypeError: the case could not be judged."""
    entry = case_entry(fixtures_dir, "moe-no-renorm_T")
    dims = GDNConfig.from_hf(dict(entry["config"])).dims()
    assert expected_shape("router_logits", 1, 5, dims) == (1, 5, entry["config"]["num_experts"])
    assert expected_shape("selected_experts", 2, 3, dims) == (2, 3, entry["config"]["num_experts_per_tok"])
    with pytest.raises(FixtureError, match="no stage tensor or state"):
        expected_shape("attn_outt", 1, 5, dims)
    dense = GDNConfig.from_hf(dict(case_entry(fixtures_dir, "decode_T")["config"])).dims()
    with pytest.raises(FixtureError, match="sparse tensor on a dense case"):
        expected_shape("router_logits", 1, 5, dense)

    def as_int32(t):
        for k in [k for k in t if k.endswith(".selected_experts")]:
            t[k] = t[k].astype(np.int32)

    perfect_outputs(fixtures_dir, "moe-no-renorm_T", tmp_path, alter=as_int32)
    (case,) = verify(fixtures_dir, tmp_path, "f32", cases=["moe-no-renorm_T"]).cases
    assert case.status == "pass", case.problem
    routed = [r for r in case.records if r.tensor == "selected_experts"]
    assert routed and all(r.verdict == "pass" and r.dtype == "I32" for r in routed)


def test_an_outputs_tensor_of_no_call_is_noted_and_a_missing_seq_len_counted(fixtures_dir, tmp_path):
    """Issue 26 leftovers: a tensor of a call the program does not have was ignored without a word, and a
    missing seq_len was not counted as not provided."""
    def extra(t):
        t["calls.7.out"] = t["calls.0.out"]
        for k in [k for k in t if k.endswith(".seq_len")]:
            del t[k]

    perfect_outputs(fixtures_dir, "decode_T12", tmp_path, alter=extra)
    (case,) = verify(fixtures_dir, tmp_path, "f32", cases=["decode_T12"]).cases
    assert case.status == "pass"
    assert any("call(s) 7 ignored" in n and "no such call" in n for n in case.notes), case.notes
    missing = [r for r in case.records if r.verdict == "missing"]
    calls = [s for s in case_entry(fixtures_dir, "decode_T12")["program"] if s["op"] in ("forward", "decode")]
    assert {r.tensor for r in missing} == {"seq_len"} and len(missing) == len(calls)
