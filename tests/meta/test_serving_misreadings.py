"""Misreadings of the serving contract (issue 24 item 3; conformance/meta/serving_mutants.py,
``SERVING_MISREADINGS``): each, a correct port with one plausible misreading of docs/serving.md, fails
the committed suite's serving cases at the step and stage where it breaks, by at least ten times the
bound (an exact seq_len check: infinitely), in every profile. And ``free`` refuses an id that is not
a slot of the pool (the padding id included) before it writes anything."""

from __future__ import annotations

import numpy as np
import pytest

from gdncheck.calls import PAD_SLOT_ID, check_free_slots
from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.meta import kill_matrix
from gdncheck.conformance.meta.catalogue import ALL_MUTANTS
from gdncheck.conformance.meta.serving_mutants import SERVING_MISREADINGS
from gdncheck.errors import InputShapeError, SlotIndexError
from gdncheck.fixtures.recipes import cfg_of
from gdncheck.reference import serving as ref_serving
from gdncheck.stages import STATE_STAGE


def test_the_misreadings_are_in_the_catalogue():
    assert {m.name for m in SERVING_MISREADINGS} == {"commit_writes_reset", "snapshot_seq_len_offset", "free_noop",
                                                    "free_keeps_seq_len"}
    assert {m.name for m in SERVING_MISREADINGS} <= {m.name for m in ALL_MUTANTS}
    assert all(m.call for m in SERVING_MISREADINGS)


def _elem_ratios(summary, stage, case_prefix=None, call=None):
    return [rec.metrics["max_err"] / rec.bound["elem"] for c in summary.cases for rec in c.records
            if rec.verdict == "fail" and rec.metrics and rec.stage == stage
            and (case_prefix is None or c.id.startswith(case_prefix)) and (call is None or rec.call == call)]


@pytest.mark.parametrize("profile", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("mutant", SERVING_MISREADINGS, ids=[m.name for m in SERVING_MISREADINGS])
def test_a_misreading_fails_at_its_step_and_stage(fixtures_dir, tmp_path, mutant, profile):
    r = kill_matrix.kill(mutant, profile, fixtures_dir, out_dir=tmp_path)
    recipe, call = mutant.call
    assert r.killed and r.first_stage == mutant.stage, r.cell()
    assert r.stage_margin >= kill_matrix.GOAL, r.cell()
    # its recipe's case fails, and any other (the depth cases' prefix snapshots at seq_pos > 0, issue 44) at
    # the same stage
    own = [c for c in r.first_by_case if c.startswith(recipe)]
    assert own and all(fd.stage == mutant.stage for fd in r.first_by_case.values()), r.first_by_case
    assert set(r.first_by_case) - set(own) <= {c for c in r.first_by_case if c.startswith("spec-windows")}
    fd = r.first_by_case[own[0]]
    assert (fd.call, fd.stage) == (call, mutant.stage), fd
    s = verify(fixtures_dir, tmp_path, profile, cases=own)
    if mutant.stage == STATE_STAGE:  # only the bookkeeping is wrong: the pool's seq_len, judged exactly
        failed = [rec for c in s.cases for rec in c.records if rec.verdict == "fail" and rec.call == call]
        assert failed and {rec.reason for rec in failed} == {"seq_len"}, [(x.tensor, x.reason) for x in failed]
        if mutant.name == "snapshot_seq_len_offset":  # ... which resets the continuation from the snapshot
            assert max(_elem_ratios(s, "conv1d", recipe, call + 1)) >= 10
    else:
        assert max(_elem_ratios(s, mutant.stage, recipe, call)) >= 10
        located = " ".join(c.message for c in s.cases if c.first_divergence)
        assert "pool slots over the bound" in located, located


# --- free: ids that are not slots --------------------------------------------------------------------
CFG = cfg_of(Hk=2, Hv=4, dk=16, dv=16)


@pytest.mark.parametrize("bad", [PAD_SLOT_ID, 4, -2])
def test_free_refuses_an_id_that_is_not_a_slot(bad):
    with pytest.raises(SlotIndexError) as exc:
        check_free_slots([1, bad], 4, None)
    assert exc.value.code == "slot_index" and f"found slot {bad}" in str(exc.value)
    pool = ref_serving.StatePool(CFG, 4)
    pool.conv_state[:] = 1.0
    pool.recurrent_state[:] = 2.0
    pool.seq_len[:] = 7
    with pytest.raises(SlotIndexError):
        pool.free([1, bad])  # refused before anything is written: slot 1 is not freed either
    assert (pool.conv_state == 1.0).all() and (pool.recurrent_state == 2.0).all() and (pool.seq_len == 7).all()
    pool.free([1, 3, 1])  # a slot named twice is freed once
    assert pool.seq_len.tolist() == [7, 0, 7, 0]
    assert not pool.conv_state[[1, 3]].any() and not pool.recurrent_state[[1, 3]].any()
    assert (pool.conv_state[[0, 2]] == 1.0).all()


def test_free_takes_an_int_or_ints():
    assert check_free_slots(2, 4, None).tolist() == [2]
    assert check_free_slots(np.array([0, 3], dtype=np.int32), 4, None).tolist() == [0, 3]
    with pytest.raises(InputShapeError):
        check_free_slots([1.0], 4, None)


def test_the_triton_pool_refuses_the_same_ids():
    pytest.importorskip("torch")
    gpu = pytest.importorskip("gdncheck.gpu_impl.serving")
    pool = gpu.StatePool(CFG, 3)
    pool.seq_len.fill_(4)
    for bad in (PAD_SLOT_ID, 3):
        with pytest.raises(SlotIndexError):
            pool.free([2, bad])
    assert pool.seq_len.tolist() == [4, 4, 4]
    pool.free([2])
    assert pool.seq_len.tolist() == [4, 4, 0]


def test_a_packed_failure_detail_line_names_the_sequence_not_one_row():
    """The detail of a packed record said 'first at token 9 (position 9, row 0)', as if the stream were one
    row at sequence 0's position, while the headline named the sequence: both now say the sequence."""
    from gdncheck.conformance.judge import messages
    from gdncheck.conformance.judge.packed import locate_token
    from gdncheck.conformance.judge.records import Record

    step = {"op": "forward_packed", "call": 0, "cu_seqlens": [0, 4, 10], "seq_pos": [0, 20], "slots": [1, 0]}
    failure = messages.bound_failure(subject=messages.Subject("core", "delta_rule", 0), metrics={
        "numel": 10, "max_err": 2.0, "max_err_index": [0, 9], "nmse": 1.0, "sqnr_db": 0.0},
        bound={"source": "global", "profile": "f32", "elem": 1e-5, "nmse": 1e-9}, actual=1.0, expected=0.0,
        allowed=1e-5, over=1, first=(9, 9, 0), elem_failed=True,
        where=messages.Where("c", 1, "forward_packed"))
    rec = Record(case="c", step=1, op="forward_packed", call=0, tensor="core", stage="delta_rule", stage_index=6,
                 verdict="fail", message=str(failure), failure=failure, first_bad_token=9, first_bad_position=9,
                 first_bad_row=0)
    locate_token(rec, step)
    assert (rec.first_bad_row, rec.first_bad_token, rec.first_bad_position) == (1, 5, 25)
    assert "(position 9, row 0)" not in rec.message
    assert "first at sequence 1's token 5 (position 25)" in rec.message
    assert "stream token 9 is sequence 1 (slot 0, 6 tokens), its token 5 at position 25" in rec.message
