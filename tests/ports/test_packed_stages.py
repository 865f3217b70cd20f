"""Stage-isolated packed calls (FORMAT.md §8, packed calls): the real-size serving cases keep each packed call's
stage inputs and the pool entering it, ``gdncheck run --stage-isolated`` hands a port's ``run_packed_stage`` the
call's layout, a port without one gets the case not applicable, and verify judges what a port wrote or says why
it judged nothing.

The cases are built here from their recipes (about 2 s each): the committed suite is rebuilt once by hand
(fixtures/FORMAT.md §10), and these tests hold for the recipes whether it was yet or not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gdncheck.cli import main
from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.ports.run import packed_layout, run_impl
from gdncheck.fixtures.manifest import load_manifest
from gdncheck.harness import call_key, call_steps, golden_inputs, is_packed
from gdncheck.safetensors_io import SafetensorsFile
from gdncheck.stages import STATE_NAMES

SERVING = ("d128-packed", "d128-spec-decode", "d128-prefix")
#: the stages whose inputs a packed call keeps: from qkv to core
PACKED_STAGES = ("conv1d", "qk_norm", "gates", "delta_rule")


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("serving") / "suite"
    argv = ["fixtures", "build", "--out", str(out), "-q"]
    for case in SERVING:
        argv += ["--case", case]
    assert main(argv) == 0
    return out


def _entries(suite: Path) -> dict[str, dict]:
    return {e["id"].split("_")[0]: e for e in load_manifest(suite)["cases"]}


def _gold(suite: Path, entry: dict) -> SafetensorsFile:
    return SafetensorsFile(suite / entry["file"])


def test_each_packed_call_keeps_its_stage_inputs_and_the_pool_entering_it(suite):
    entries = _entries(suite)
    assert set(entries) == set(SERVING)
    for name, entry in entries.items():
        assert entry["state_in"], name
        gold = _gold(suite, entry)
        S, cfg = entry["batch"], entry["config"]
        for step in call_steps(entry["program"]):
            if step["op"] == "commit":
                continue
            k = step["call"]
            for stage in PACKED_STAGES:
                assert golden_inputs(gold, k, stage) is not None, (name, k, stage)
            assert gold[call_key(k, "recurrent_state_in")].shape == (S, cfg["linear_num_value_heads"], 128, 128)
            assert gold[call_key(k, "conv_state_in")].shape[0] == S


def test_the_pool_entering_a_call_is_the_pool_the_last_one_left_with_the_seq_len_rule_applied(suite):
    """Independent of the builder's capture: d128-prefix keeps the pool after both calls, so the pool
    entering call 1 is call 0's (no sequence of call 1 is reset: slot 2 holds the 30-token snapshot it
    continues from at seq_pos 30, slot 0 request 0 at 70); in d128-packed the decode call reads both
    prefills' states, and the new request at position 0 in freed slot 0 zeros."""
    entries = _entries(suite)
    prefix = _gold(suite, entries["d128-prefix"])
    for name in STATE_NAMES:
        after0, in1 = prefix[call_key(0, name)], prefix[call_key(1, f"{name}_in")]
        assert np.array_equal(after0, in1), name
        assert np.abs(in1[2]).max() > 0 and np.abs(in1[1]).max() > 0  # the snapshots' slots hold states
    packed = _gold(suite, entries["d128-packed"])
    last = call_steps(entries["d128-packed"]["program"])[-1]
    assert list(last["slots"]) == [0, 2] and list(last["seq_pos"])[0] == 0
    rec_in = packed[call_key(last["call"], "recurrent_state_in")]
    assert not rec_in[0].any() and rec_in[2].any()  # slot 0 (freed, at position 0): zeros; slot 2 its state
    assert not rec_in[1].any()  # slot 1, never used
    carried = packed[call_key(call_steps(entries["d128-packed"]["program"])[1]["call"], "recurrent_state_in")]
    assert carried[0].any() and carried[2].any()  # the decode call reads both prefills' states


def test_a_packed_step_s_layout_is_what_run_packed_stage_is_given(suite):
    step = next(s for s in _entries(suite)["d128-prefix"]["program"] if s["op"] == "prefix_snapshots")
    layout = packed_layout(step)
    assert layout["op"] == "prefix_snapshots"
    assert layout["cu_seqlens"].tolist() == [0, 70] and layout["snap_offset"].tolist() == [64, 30]
    assert all(v.dtype == np.int64 for k, v in layout.items() if k != "op")


class _Recorder:
    """A stage-only port with a packed path that records what it was given and computes nothing."""

    calls: list = []

    def __init__(self, cfg, weights, *, profile, strict=False):
        self.name = "recorder"

    def run_stage(self, stage, inputs):
        return {}

    def run_packed_stage(self, stage, inputs, call):
        type(self).calls.append((stage, {n: np.asarray(a).shape for n, a in inputs.items()}, call["op"],
                                 call["slots"].tolist()))
        return {}


def _no_packed(cfg, weights, *, profile, strict=False):
    class Stages:
        name = "stages-only"

        def run_stage(self, stage, inputs):
            return {}

    return Stages()


def test_run_hands_a_packed_port_each_call_s_stages_and_one_without_gets_not_applicable(suite, tmp_path):
    _Recorder.calls = []
    rep = run_impl(_Recorder, suite, tmp_path / "rec", "f32", cases=["d128-prefix"], stage_isolated=True)
    assert [c.status for c in rep.cases] == ["ran"]
    seen = {(stage, op) for stage, _, op, _ in _Recorder.calls}
    # input_norm reads x, which every call keeps (its x_norm is not kept: nothing of it is judged)
    assert seen == {(s, op) for s in ("input_norm", *PACKED_STAGES) for op in ("prefix_snapshots", "forward_packed")}
    conv = next(shapes for stage, shapes, op, _ in _Recorder.calls if stage == "conv1d" and op == "forward_packed")
    assert conv == {"qkv": (4, 512), "conv_state": (3, 512, 4)}  # the stream [T, C] and the whole pool
    rep = run_impl(_no_packed, suite, tmp_path / "none", "f32", cases=["d128-prefix"], stage_isolated=True)
    assert [c.status for c in rep.cases] == ["not_applicable"] and "run_packed_stage" in rep.cases[0].detail


def test_verify_judges_a_written_packed_case_and_notes_one_a_runner_skipped(suite, tmp_path):
    """A port that wrote nothing for a case (a runner that skips packed calls, as every runner did before
    they kept stage inputs) has it left out with a note; the outputs of a packed port are judged."""
    summary = verify(suite, tmp_path, "f32", cases=["d128-prefix"], stage_isolated=True)
    assert summary.cases == [] and any("no outputs file, not judged" in n for n in summary.notes)
    _Recorder.calls = []
    run_impl(_Recorder, suite, tmp_path / "rec", "f32", cases=["d128-prefix"], stage_isolated=True)
    (case,) = verify(suite, tmp_path / "rec", "f32", cases=["d128-prefix"], stage_isolated=True).cases
    assert case.status == "fail"  # judged: a case that judges no tensor fails (FORMAT.md §2, coverage)
    assert all(is_packed(s) for s in call_steps(_entries(suite)["d128-prefix"]["program"]))


class _Refuses(_Recorder):
    """A packed path that refuses one kind of call (as vLLM's spec path refuses packed calls)."""

    def run_packed_stage(self, stage, inputs, call):
        from gdncheck.harness import NotApplicable

        if call["op"] == "verify_spec":
            raise NotApplicable("no speculative verify here")
        return {}


def test_a_stage_that_says_not_applicable_makes_the_case_not_applicable_not_an_engine_error(suite, tmp_path):
    rep = run_impl(_Refuses, suite, tmp_path / "na", "f32", cases=["d128-spec-decode"], stage_isolated=True)
    assert [(c.status, c.detail) for c in rep.cases] == [("not_applicable", "at step 2: no speculative verify here")]
