"""The serving cases (fixtures/FORMAT.md §4.1, issue 14 item 4): built from the reference's serving
patterns, run by the reference (its emulation by plain calls), the Triton path and transformers
(not applicable), and verify localising a packed failure by sequence and token, and a wrong slot."""

from __future__ import annotations

import json
import types

import jsonschema
import numpy as np
import pytest

from gdncheck.calls import PAD_SLOT_ID
from gdncheck.config import GDNConfig
from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.ports.run import run_impl
from gdncheck.fixtures.build import build_suite
from gdncheck.fixtures.manifest import SCHEMA_PATH
from gdncheck.fixtures.reference_impl import reference_f64
from gdncheck.harness import LayerAdapter, call_key, plain_serving
from gdncheck.reference import Layer
from gdncheck.reference import serving as ref_serving
from gdncheck.safetensors_io import SafetensorsFile
from gdncheck.snapshot import Snapshot


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("serving-fixtures")
    build_suite("serving", out)
    return out


def _manifest(suite_dir):
    return json.loads((suite_dir / "manifest.json").read_text())


def test_serving_cases_follow_the_schema_and_cover_issue_14(suite_dir):
    raw = _manifest(suite_dir)
    jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text())).validate(raw)
    steps = [s for c in raw["cases"] for s in c["program"]]
    lengths = {int(b - a) for s in steps if "cu_seqlens" in s for a, b in zip(s["cu_seqlens"], s["cu_seqlens"][1:])}
    assert {1, 63, 64, 65} <= lengths
    assert any(PAD_SLOT_ID in s.get("slots", []) and s["op"] == "forward_packed" for s in steps)
    accepted = {n for s in steps if s["op"] == "commit" for n in s["accepted"]}
    assert {0, 1, 4} <= accepted  # k = 4 draft tokens
    offsets = {o for s in steps for o in s.get("snap_offset", [])}
    assert {64, 128} <= offsets and 100 in offsets  # chunk ends and inside a chunk (C = 64)
    tags = {t for c in raw["cases"] for t in c["tags"]}
    assert {"packed", "slots", "spec-decode", "prefix-cache", "seq-len-reset"} <= tags
    freed = [s for s in steps if s["op"] == "free"]
    assert freed and all(s["op"] != "free" or s["slots"] for s in steps)


def test_serving_cases_cover_the_misreadings_of_issue_24(suite_dir):
    """What the contract's misreadings need to show (conformance/meta/serving_mutants.py): a commit of 0
    for a slot its verify read as zeros, a snapshot of a sequence at seq_pos > 0 continued from, and a
    freed slot that the next call does not name (its pool recorded after the free)."""
    commit_0_of_reset = snapshot_later = continued = freed_unnamed = False
    for case in _manifest(suite_dir)["cases"]:
        if "error" in case["tags"]:
            continue  # the serving error cases end at the refused step
        program, seq_len, resets, snapped = case["program"], [0] * case["batch"], {}, {}
        for i, step in enumerate(program):
            op = step["op"]
            if op in ("verify_spec", "forward_mixed"):  # a mixed call's commit commits its verify rows
                resets[step["call"]] = [s != PAD_SLOT_ID and seq_len[s] != p
                                        for s, p in zip(step["slots"], step["seq_pos"])]
            if op == "commit":
                commit_0_of_reset |= any(r and n == 0 for r, n in zip(resets[step["of_call"]], step["accepted"]))
            if op == "prefix_snapshots":
                for j, o, d in zip(step["snap_seq"], step["snap_offset"], step["snap_slot"]):
                    if step["seq_pos"][j] > 0:
                        snapshot_later, snapped[d] = True, step["seq_pos"][j] + o
            if op in ("forward_packed", "prefix_snapshots", "verify_spec", "forward_mixed"):
                continued |= any(snapped.get(s) == p for s, p in zip(step["slots"], step["seq_pos"]))
            if op == "free":
                after = next(s for s in program[i + 1:] if "seq_len_after" in s)
                freed_unnamed |= bool(set(step["slots"]) - set(after["slots"]))
                for s in step["slots"]:
                    seq_len[s] = 0
            if "seq_len_after" in step:
                seq_len = list(step["seq_len_after"])
    assert commit_0_of_reset and snapshot_later and continued and freed_unnamed


def test_goldens_equal_plain_calls_of_the_layer(suite_dir):
    """The stored pool after each packed call equals the state of plain calls of the layer, one per
    sequence (the definition, docs/serving.md), computed here independently of the golden builder."""
    entry = next(c for c in _manifest(suite_dir)["cases"] if c["id"].startswith("packed-mixed"))
    f = SafetensorsFile(suite_dir / entry["file"])
    cfg = GDNConfig.from_hf(entry["config"])
    layer = Layer(cfg, {k[len("weights."):]: f.read(k) for k in f if k.startswith("weights.")})
    pool = layer.new_state(entry["batch"])
    for step in entry["program"]:
        if step["op"] == "free":
            pool.reset(np.asarray(step["slots"]))
        if step["op"] != "forward_packed":
            continue
        x, cu = f.read(call_key(step["call"], "x")), step["cu_seqlens"]
        for i, slot in enumerate(step["slots"]):
            one = layer.new_state(1)
            if slot != PAD_SLOT_ID:
                one.conv_state[0], one.recurrent_state[0], one.seq_len[0] = (pool.conv_state[slot],
                                                                            pool.recurrent_state[slot],
                                                                            pool.seq_len[slot])
            out, _ = layer.forward(x[None, cu[i]:cu[i + 1]], one, [step["seq_pos"][i]])
            np.testing.assert_allclose(f.read(call_key(step["call"], "out"))[cu[i]:cu[i + 1]], out[0],
                                       rtol=1e-10, atol=1e-10)
            if slot != PAD_SLOT_ID:
                pool.conv_state[slot], pool.recurrent_state[slot] = one.conv_state[0], one.recurrent_state[0]
                pool.seq_len[slot] = one.seq_len[0]
        np.testing.assert_allclose(f.read(call_key(step["call"], "recurrent_state")), pool.recurrent_state,
                                   rtol=1e-10, atol=1e-12)
        assert pool.seq_len.tolist() == step["seq_len_after"]


@pytest.mark.parametrize("profile", ["f32", "bf16"])
def test_reference_emulation_conforms(suite_dir, tmp_path, profile):
    run_impl("reference", suite_dir, tmp_path, profile)
    s = verify(suite_dir, tmp_path, profile)
    assert s.exit_code == 0, [c.message for c in s.cases if c.status != "pass"]
    assert s.totals()["records_missing"] == 0


def test_triton_conforms_on_a_packed_case(suite_dir, tmp_path):
    cases = [c["id"] for c in _manifest(suite_dir)["cases"] if c["id"].startswith(("packed-mixed", "spec-decode"))]
    run_impl("triton", suite_dir, tmp_path, "f32", cases=cases)
    s = verify(suite_dir, tmp_path, "f32", cases=cases)
    assert s.exit_code == 0, [c.message for c in s.cases if c.status != "pass"]
    assert s.totals()["records_missing"] == 0


def test_transformers_is_not_applicable_with_a_reason(suite_dir, tmp_path):
    pytest.importorskip("transformers")
    run_impl("hf", suite_dir, tmp_path, "f32")
    s = verify(suite_dir, tmp_path, "f32")
    # every serving case has features (the coverage rule lets a port lack them), so each is not
    # applicable, not failed; a run that judged nothing is still no pass (exit 2, FORMAT.md §2)
    assert all(c.status == "not_applicable" for c in s.cases) and all(c.features for c in s.cases)
    assert all("packed cu_seqlens stream" in c.not_applicable["reason"] for c in s.cases)
    assert s.exit_code == 2


# --- verify localises serving bugs ------------------------------------------------------------------
def _buggy(serving):
    def factory(cfg, weights, *, profile="f64", strict=False, **_):
        layer = Layer(cfg, weights, strict=strict)
        return LayerAdapter(layer, "buggy serving", load_snapshot=Snapshot.load, serving=serving)
    return factory


def _wrong_slot_forward(layer, pool, x, cu, pos, slots):
    """Writes each sequence's state to the next slot up (mod S) besides its own: state read from slot
    i, written to slot j too."""
    out, trace = ref_serving.forward_packed(layer, pool, x, cu, pos, slots)
    for s in np.asarray(slots)[np.asarray(slots) != PAD_SLOT_ID][:1]:
        j = (int(s) + 1) % pool.batch
        if j not in set(np.asarray(slots).tolist()):
            pool.conv_state[j], pool.recurrent_state[j] = pool.conv_state[s], pool.recurrent_state[s]
    return out, trace


def _leaky_forward(layer, pool, x, cu, pos, slots):
    """The conv window leaks across packed boundaries: each sequence after the first starts from the
    conv history the previous sequence left (its slot's recurrent state is right)."""
    carry = None
    pieces, finals = [], []
    for i in range(len(slots)):
        one = plain_serving._row(layer, pool, int(slots[i]))
        if carry is not None:
            one.conv_state[0] = carry
        pieces.append(layer.forward(np.asarray(x)[None, cu[i]:cu[i + 1]], one, np.array([pos[i]])))
        carry = one.conv_state[0].copy()
        finals.append(one)
    for i, slot in enumerate(np.asarray(slots).tolist()):
        if slot != PAD_SLOT_ID:
            plain_serving._put(pool, slot, finals[i])
    return plain_serving._cat(pieces)


def _verify_with(suite_dir, tmp_path, forward):
    serving = types.SimpleNamespace(forward_packed=forward)
    cases = [c["id"] for c in _manifest(suite_dir)["cases"] if c["id"].startswith("packed-mixed")]
    run_impl(_buggy(serving), suite_dir, tmp_path, "f64", cases=cases)
    return verify(suite_dir, tmp_path, "f32", cases=cases).cases[0]


def test_verify_names_a_slot_the_call_must_not_touch(suite_dir, tmp_path):
    case = _verify_with(suite_dir, tmp_path, _wrong_slot_forward)
    assert case.status == "fail"
    assert "touched a slot it must not" in case.message and "slot(s) [" in case.message


def test_verify_reports_a_packed_failure_by_sequence_and_token(suite_dir, tmp_path):
    case = _verify_with(suite_dir, tmp_path, _leaky_forward)
    assert case.status == "fail"
    fd = case.first_divergence
    # the first call packs 63, 1, 65, 64 tokens: sequence 1 is the first to start after another one
    assert (fd.call, fd.stage, fd.row, fd.token) == (0, "conv1d", 1, 0), fd
    assert "sequence 1 (slot 0, 1 tokens), its token 0" in case.message


def test_reference_f64_factory_runs_the_serving_patterns():
    """The golden factory hands the serving ops to reference/serving.py (not to plain calls)."""
    from gdncheck.fixtures.recipes import cfg_of
    from gdncheck.synthetic import make_weights

    cfg = cfg_of()
    impl = reference_f64(cfg, make_weights(cfg, 0))
    assert impl._serving is ref_serving
