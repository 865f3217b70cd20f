"""The serving patterns on the Triton path (gpu_impl/serving.py) against the float64 reference's
(reference/serving.py, itself equal to plain calls to 1e-12): packed calls mixing decodes and
prefills over permuted and reused pool slots, the padding slot, the per-slot seq-len rule inside a
packed call, speculative verify and commit, prefix snapshots at and inside chunks, the errors, and
the device layout (no host read, grids sized from shapes).

Lengths 1, 5, 16 and 17 with chunk 16: a decode, a chunk's inside, one full chunk, a chunk and one
token. Both pools start from the same states (the reference's rounded to the profile's state
dtypes); slots no sequence names must stay bit for bit as they were.
"""

from __future__ import annotations

import importlib
import logging

import numpy as np
import pytest
import torch

import gdncheck.reference as R
from gdncheck import errors as E
from gdncheck.calls import PAD_SLOT_ID
from gdncheck.config import REAL
from gdncheck.gpu_impl import Layer
from gdncheck.gpu_impl import memory as M
from gdncheck.gpu_impl import serving as G
from gdncheck.gpu_impl.delta_rule_chunked import delta_rule_chunked_packed
from gdncheck.gpu_impl.packed import Packed, chunk_bound, chunk_map, every_token
from gdncheck.gpu_impl.target import GRID_LIMITS, record_launches
from gdncheck.reference import serving as RS
from gdncheck.synthetic import make_inputs, make_weights
from tests.gpu_impl.compare import check
from tests.gpu_impl.helpers import DEVICE, PROFILE_NAMES, rng_for
from tests.gpu_impl.test_gpu_ready import HostTraffic, peak_allocated
from tests.helpers import tiny_config

CFG = tiny_config(Hk=2, Hv=4, dk=16, dv=8, D=32, I=48)
CHUNK = 16
POOL = 8
WEIGHTS = make_weights(CFG, seed=0)
REF = R.Layer(CFG, WEIGHTS, chunk_size=CHUNK)


def layer(profile: str, **kw) -> Layer:
    return Layer(CFG, WEIGHTS, profile=profile, device=DEVICE, chunk_size=CHUNK, **kw)


def pools(profile: str, seed: int = 0) -> tuple[RS.StatePool, G.StatePool]:
    """A reference pool and a device pool holding the same arbitrary states (the reference's rounded to
    the device pool's dtypes) at arbitrary positions."""
    rng = rng_for("pool", seed)
    gpu = G.StatePool.for_layer(layer(profile), POOL)
    gpu.conv_state.copy_(torch.tensor(rng.normal(size=gpu.conv_state.shape)))
    gpu.recurrent_state.copy_(torch.tensor(rng.normal(scale=0.3, size=gpu.recurrent_state.shape)))
    gpu.seq_len.copy_(torch.tensor(rng.integers(1, 300, size=POOL)))
    ref = RS.StatePool(CFG, POOL)
    ref.conv_state[:] = gpu.conv_state.cpu().double().numpy()
    ref.recurrent_state[:] = gpu.recurrent_state.cpu().double().numpy()
    ref.seq_len[:] = gpu.seq_len.cpu().numpy()
    return ref, gpu


def packed(lengths, seed=1):
    """x [total, D] and cu_seqlens for sequences of the given lengths."""
    x = make_inputs(CFG, 1, int(sum(lengths)), seed=seed)[0]
    return x, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def positions(pool: RS.StatePool, slots) -> np.ndarray:
    """Each sequence's position where its slot stands (0 for padding)."""
    return np.array([pool.seq_len[s] if s != PAD_SLOT_ID else 0 for s in slots], dtype=np.int64)


def assert_pool_matches(gpu: G.StatePool, ref: RS.StatePool, slots, profile: str, what: str):
    for s in slots:
        check(gpu.recurrent_state[s], ref.recurrent_state[s], "layer", profile, f"{what}: recurrent state of slot {s}")
        check(gpu.conv_state[s], ref.conv_state[s], "layer", profile, f"{what}: conv state of slot {s}")
    assert gpu.seq_len.tolist() == ref.seq_len.tolist(), what


def assert_untouched(gpu: G.StatePool, before, slots):
    """Bit for bit as before (``before``: a DeviceSnapshot)."""
    for s in slots:
        assert torch.equal(gpu.conv_state[s], before.conv_state[s]), f"slot {s}: conv state changed"
        assert torch.equal(gpu.recurrent_state[s], before.recurrent_state[s]), f"slot {s}: recurrent state changed"
        assert int(gpu.seq_len[s]) == int(before.seq_len[s]), f"slot {s}: seq_len changed"


def check_outputs(got, trace, want, ref_trace, cu, profile: str, what: str):
    """out and what the layer adds (out alone is dominated by the residual stream), per sequence."""
    for i in range(len(cu) - 1):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        check(got[rows], want[rows], "layer", profile, f"{what}: out of sequence {i}")
        for name in ("core", "attn_out", "mlp_out") if trace else ():
            check(trace[name][rows], ref_trace[name][rows], "layer", profile, f"{what}: {name} of sequence {i}")


# --- packed calls -----------------------------------------------------------------------------------
#: (profile, heads per program of the fused conv kernel and of the recurrent delta rule): every
#: profile with the interpreter's form (every head in one program), and in one profile the GPU's
#: (one head: the compiled form) and two (conv: a last group with an empty slot, 2·Hk + Hv = 8 of
#: BD 16 lanes each; delta rule: value heads in pairs of dk 16 × dv 8)
CONV_FORMS = [(p, None) for p in PROFILE_NAMES] + [("bf16", 1), ("bf16", 2)]


def conv_form(monkeypatch, heads: int | None) -> None:
    if heads is not None:  # (the package exports functions named conv1d and delta_rule: the modules by path)
        monkeypatch.setattr(importlib.import_module("gdncheck.gpu_impl.conv1d"), "_INTERPRETER_LANES", heads * 16)
        monkeypatch.setattr(importlib.import_module("gdncheck.gpu_impl.delta_rule"), "_INTERPRETER_STATE",
                            heads * 16 * 8)


@pytest.mark.parametrize("profile,heads", CONV_FORMS)
def test_mixed_packed_call_against_reference(profile, heads, caplog, monkeypatch):
    """Decode and prefills (1, 5, 16, 17 tokens) and a padding sequence in one chunked call, on permuted
    slots; sequence 1's seq_pos differs from its slot's seq_len (read as zeros, one warning naming it).
    Then the same slots again, in another order, continuing (reused slots, the recurrent form)."""
    conv_form(monkeypatch, heads)
    ref, gpu = pools(profile)
    lay = layer(profile)
    lengths, slots = [1, 5, 2, 16, 17], [6, 0, PAD_SLOT_ID, 3, 7]
    x, cu = packed(lengths, seed=1)
    pos = positions(ref, slots)
    pos[1] += 3
    before = gpu.snapshot()
    with caplog.at_level(logging.WARNING, logger="gdncheck.gpu_impl"):
        got, trace = G.forward_packed(lay, gpu, x, cu, pos, slots, capture=True)
        if DEVICE.type == "cuda":  # the report reaches the host asynchronously: let it arrive
            torch.cuda.synchronize()
            gpu.flush_warnings(logging.getLogger("gdncheck.gpu_impl"), None)
    want, ref_trace = RS.forward_packed(REF, ref, x, cu, pos, slots)
    assert got.shape == (cu[-1], CFG.hidden_size) and got.dtype == lay.dtype
    assert set(trace) == set(ref_trace) and trace["q"].shape == ref_trace["q"].shape
    check_outputs(got, trace, want, ref_trace, cu, profile, "packed call")
    check(trace["qkv_conv"], ref_trace["qkv_conv"], "layer", profile, "qkv_conv (windows restart per sequence)")
    assert_pool_matches(gpu, ref, [0, 3, 6, 7], profile, "after the packed call")
    assert_untouched(gpu, before, [1, 2, 4, 5])  # 5 = POOL - 3; 7 is named; nothing wraps -1
    assert [r.getMessage() for r in caplog.records if r.name == "gdncheck.gpu_impl"] == [
        f"linear_attention state mismatch at layer None: sequence 1 (slot 0): slot seq_len={pos[1] - 3}, "
        f"seq_pos={pos[1]}. Resetting the state of slot(s) [0]."]
    assert gpu.warned

    lengths, slots = [1, 1, 3, 1], [7, 0, 6, PAD_SLOT_ID]
    x, cu = packed(lengths, seed=2)
    pos = positions(ref, slots)
    before = gpu.snapshot()
    got, trace = G.forward_packed(lay, gpu, x, cu, pos, slots, capture=True)
    want, ref_trace = RS.forward_packed(REF, ref, x, cu, pos, slots)
    check_outputs(got, trace, want, ref_trace, cu, profile, "continued")
    assert_pool_matches(gpu, ref, [0, 6, 7], profile, "after the second call")
    assert_untouched(gpu, before, [1, 2, 3, 4, 5])


@pytest.mark.parametrize("profile,heads", CONV_FORMS)
def test_decode_batch_with_slot_indices(profile, heads, monkeypatch):
    """One token per sequence (the decode kernels write each slot in place, padding never), a new
    request (seq_pos 0) on a reused slot among them."""
    conv_form(monkeypatch, heads)
    ref, gpu = pools(profile, seed=1)
    lay = layer(profile)
    slots = [5, PAD_SLOT_ID, 2, 7, PAD_SLOT_ID, 0]
    x, cu = packed([1] * len(slots), seed=3)
    pos = positions(ref, slots)
    pos[3] = 0
    before = gpu.snapshot()
    got, trace = G.forward_packed(lay, gpu, x, cu, pos, slots, capture=True)
    want, ref_trace = RS.forward_packed(REF, ref, x, cu, pos, slots)
    check_outputs(got, trace, want, ref_trace, cu, profile, "decode")
    assert_pool_matches(gpu, ref, [0, 2, 5, 7], profile, "after decode")
    assert_untouched(gpu, before, [1, 3, 4, 6])


@pytest.mark.parametrize("form", ["recurrent", "chunked"])
def test_forced_delta_rule_form(form):
    """Either form on any layout: the recurrent kernel over 17-token sequences, the chunked one over
    one-token sequences."""
    ref, gpu = pools("f32", seed=2)
    lay = layer("f32")
    lengths, slots = [17, 1, 16], [4, 1, 2]
    x, cu = packed(lengths, seed=4)
    pos = positions(ref, slots)
    got, trace = G.forward_packed(lay, gpu, x, cu, pos, slots, delta_rule=form, capture=True)
    want, ref_trace = RS.forward_packed(REF, ref, x, cu, pos, slots, delta_rule=form)
    check_outputs(got, trace, want, ref_trace, cu, "f32", f"delta_rule={form}")
    assert_pool_matches(gpu, ref, slots, "f32", f"delta_rule={form}")


# --- speculative verify and commit ----------------------------------------------------------------
@pytest.mark.parametrize("profile,heads", CONV_FORMS)
def test_verify_every_step_and_commit_zero_one_k(profile, heads, monkeypatch):
    """k = 4, 3, 1, 2 draft tokens (the last a padding sequence): outputs and every step's state as the
    reference's, no slot written; commit 0 (slot bit-identical), 1 and k; then the next decode of each
    request continues without a reset."""
    conv_form(monkeypatch, heads)
    ref, gpu = pools(profile, seed=3)
    lay = layer(profile)
    lengths, slots = [4, 3, 1, 2], [3, 6, 1, PAD_SLOT_ID]
    x, cu = packed(lengths, seed=5)
    pos = positions(ref, slots)
    before = gpu.snapshot()
    got, trace, spec = G.verify_spec(lay, gpu, x, cu, pos, slots, capture=True)
    want, ref_trace, ref_spec = RS.verify_spec(REF, ref, x, cu, pos, slots)
    check_outputs(got, trace, want, ref_trace, cu, profile, "verify")
    assert_untouched(gpu, before, range(POOL))
    for i in range(len(lengths)):
        for row in range(cu[i], cu[i + 1]):
            check(spec.recurrent_state_steps[row], ref_spec.recurrent_state_steps[row], "layer", profile,
                  f"recurrent state after token {row - cu[i] + 1} of sequence {i}")
            check(spec.conv_state_steps[row], ref_spec.conv_state_steps[row], "layer", profile,
                  f"conv state after token {row - cu[i] + 1} of sequence {i}")
    accepted = [0, 1, 1, 2]
    G.commit(spec, accepted)
    RS.commit(ref_spec, accepted)
    assert_untouched(gpu, before, [0, 2, 3, 4, 5, 7])  # slot 3 took 0 tokens
    assert_pool_matches(gpu, ref, [1, 6], profile, "after commit")
    assert gpu.seq_len[[1, 3, 6]].tolist() == [pos[2] + 1, pos[0], pos[1] + 1]
    x2, cu2 = packed([1, 1, 1], seed=6)
    pos2 = positions(ref, [3, 6, 1])
    got, _ = G.forward_packed(lay, gpu, x2, cu2, pos2, [3, 6, 1])
    want, _ = RS.forward_packed(REF, ref, x2, cu2, pos2, [3, 6, 1])
    check_outputs(got, None, want, None, cu2, profile, "decode after commit")
    assert not gpu.warned and not ref.warned


def test_verify_in_the_chunked_form():
    """Asked for, the chunked form keeps every token's state too: inside its chunk, the chunk's update
    cut there (17 tokens: a whole chunk and one more)."""
    ref, gpu = pools("f32", seed=9)
    lay = layer("f32")
    lengths, slots = [17, 2], [5, 0]
    x, cu = packed(lengths, seed=12)
    pos = positions(ref, slots)
    got, _, spec = G.verify_spec(lay, gpu, x, cu, pos, slots, delta_rule="chunked")
    want, _, ref_spec = RS.verify_spec(REF, ref, x, cu, pos, slots, delta_rule="chunked")
    check_outputs(got, None, want, None, cu, "f32", "chunked verify")
    check(spec.recurrent_state_steps, ref_spec.recurrent_state_steps, "layer", "f32", "every step, chunked")
    G.commit(spec, [9, 2])
    RS.commit(ref_spec, [9, 2])
    assert_pool_matches(gpu, ref, slots, "f32", "chunked verify + commit")


def test_commit_errors_change_nothing():
    ref, gpu = pools("f32", seed=4)
    lay = layer("f32")
    slots = [2, 5]
    x, cu = packed([2, 3], seed=7)
    pos = positions(ref, slots)
    _, _, spec = G.verify_spec(lay, gpu, x, cu, pos, slots)
    before = gpu.snapshot()
    with pytest.raises(E.AcceptCountError, match=r"accepted=4 for sequence 1 \(k=3\)"):
        G.commit(spec, [1, 4])
    with pytest.raises(E.InputShapeError, match="accepted as 2 ints"):
        G.commit(spec, [1])
    assert_untouched(gpu, before, range(POOL))
    gpu.free([5])  # the request of slot 5 finished meanwhile
    with pytest.raises(E.SpecCommitError, match=r"slot 5 \(sequence 1\) at the seq_len it had when verified"):
        G.commit(spec, [1, 1])
    _, _, spec = G.verify_spec(lay, gpu, x, cu, [pos[0], 0], slots)
    G.commit(spec, torch.tensor([2, 0]))
    with pytest.raises(E.SpecCommitError, match="already committed"):
        G.commit(spec, [2, 0])


# --- prefix snapshots -----------------------------------------------------------------------------
@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_prefix_snapshots_at_and_inside_chunks(profile):
    """Snapshots of a 17-token prefill after 3 (inside the first chunk), 16 (its end) and 17 tokens (the
    final state, also in its own slot), of a 16-token one at its end and of a 5-token one inside its
    chunk; each destination holds the state of the truncated prefill, seq_len = seq_pos + offset."""
    ref, gpu = pools(profile, seed=5)
    lay = layer(profile)
    lengths, slots = [5, 17, 16], [1, 4, 6]
    x, cu = packed(lengths, seed=8)
    pos = positions(ref, slots)
    snap_seq, snap_off, snap_slot = [1, 0, 1, 2, 1], [16, 2, 3, 16, 17], [0, 7, 2, 3, 5]
    got, trace = G.prefix_snapshots(lay, gpu, x, cu, pos, slots, snap_seq, snap_off, snap_slot, capture=True)
    want, ref_trace = RS.prefix_snapshots(REF, ref, x, cu, pos, slots, snap_seq, snap_off, snap_slot)
    check_outputs(got, trace, want, ref_trace, cu, profile, "prefix snapshots")
    assert_pool_matches(gpu, ref, slots + snap_slot, profile, "after prefix snapshots")
    assert gpu.seq_len[snap_slot].tolist() == [pos[s] + o for s, o in zip(snap_seq, snap_off)]


def test_prefix_snapshots_at_chunk_ends_only():
    """Offsets that are all chunk ends (or a sequence's end): the state kernel's lighter variant, which
    stores the state it carries and computes none inside a chunk."""
    ref, gpu = pools("f32", seed=10)
    lay = layer("f32")
    lengths, slots = [33, 20], [2, 5]
    x, cu = packed(lengths, seed=13)
    pos = positions(ref, slots)
    before = gpu.snapshot()
    got, _ = G.prefix_snapshots(lay, gpu, x, cu, pos, slots, [0, 0, 1], [16, 32, 16], [1, 7, 0])
    want, _ = RS.prefix_snapshots(REF, ref, x, cu, pos, slots, [0, 0, 1], [16, 32, 16], [1, 7, 0])
    check_outputs(got, None, want, None, cu, "f32", "prefix snapshots at chunk ends")
    assert_pool_matches(gpu, ref, [0, 1, 2, 5, 7], "f32", "prefix snapshots at chunk ends")
    assert_untouched(gpu, before, [3, 4, 6])


@pytest.mark.parametrize("heads", [None, 1, 2])
def test_prefix_snapshots_in_the_recurrent_form(heads, monkeypatch):
    conv_form(monkeypatch, heads)
    ref, gpu = pools("f32", seed=6)
    lay = layer("f32")
    lengths, slots = [5, 9], [3, PAD_SLOT_ID]
    x, cu = packed(lengths, seed=9)
    pos = positions(ref, slots)
    before = gpu.snapshot()
    got, _ = G.prefix_snapshots(lay, gpu, x, cu, pos, slots, [0, 0], [4, 1], [6, 0])
    want, _ = RS.prefix_snapshots(REF, ref, x, cu, pos, slots, [0, 0], [4, 1], [6, 0])
    check_outputs(got, None, want, None, cu, "f32", "recurrent prefix snapshots")
    assert_pool_matches(gpu, ref, [0, 3, 6], "f32", "recurrent prefix snapshots")
    assert_untouched(gpu, before, [1, 2, 4, 5, 7])


# --- errors: refused before anything is written ---------------------------------------------------
ERRORS = {
    "input_shape": (dict(x=np.zeros((3, 7))), E.InputShapeError, "packed x of shape"),
    "input_dtype": (dict(x=np.zeros((3, 32), dtype=np.int64)), E.InputDtypeError, "real floating dtype"),
    "cu_seqlens": (dict(cu_seqlens=[0, 2, 4]), E.CuSeqlensError, "total_tokens = 3"),
    "empty_sequence": (dict(cu_seqlens=[0, 0, 3], seq_pos=[0, 0], slots=[1, 2]), E.EmptySequenceError, "empty"),
    "slot_index": (dict(slots=[1, POOL]), E.SlotIndexError, f"found slot {POOL} for sequence 1"),
    "slot_index_minus_two": (dict(slots=[-2, 1]), E.SlotIndexError, "found slot -2"),
    "duplicate_slot": (dict(slots=[3, 3]), E.DuplicateSlotError, "slot 3 for sequence 0 and sequence 1"),
    "seq_pos": (dict(seq_pos=[1, 2, 3]), E.InputShapeError, "seq_pos as an int or 2 ints"),
    "strict": (dict(strict=True, seq_pos=[0, 0]), E.SeqPosMismatchError, r"sequence 0 \(slot 1\)"),
}


@pytest.mark.parametrize("fault", ERRORS)
def test_refused_calls_change_nothing(fault):
    change, error, message = ERRORS[fault]
    _, gpu = pools("f32", seed=7)
    lay = layer("f32")
    call = dict(x=make_inputs(CFG, 1, 3, seed=1)[0], cu_seqlens=[0, 1, 3], seq_pos=[5, 6], slots=[1, 2])
    call.update(change)
    gpu.seq_len[1], gpu.seq_len[2] = 5, 6
    before = gpu.snapshot()
    for run in (G.forward_packed, G.verify_spec):
        with pytest.raises(error, match=message) as info:
            run(lay, gpu, **call)
        assert info.value.code == error.code
        assert_untouched(gpu, before, range(POOL))
        assert gpu.warned is False


def test_snapshot_request_errors():
    _, gpu = pools("f32", seed=8)
    lay = layer("f32")
    x, cu = packed([2, 3], seed=10)
    pos = gpu.seq_len[[1, 2]].tolist()
    before = gpu.snapshot()
    for req, error, message in (
        (([1], [4], [5]), E.SnapshotRequestError, r"snap_offset in 1..3"),
        (([0], [1], [2]), E.DuplicateSlotError, "slot 2 for sequence 1 and snapshot request 0"),
        (([0], [1], [PAD_SLOT_ID]), E.SlotIndexError, "never the padding id"),
    ):
        with pytest.raises(error, match=message):
            G.prefix_snapshots(lay, gpu, x, cu, pos, [1, 2], *req)
        assert_untouched(gpu, before, range(POOL))


def test_pool_must_fit_the_layer():
    lay = layer("bf16")
    x, cu = packed([2], seed=11)
    with pytest.raises(E.InputError, match="in its dtype"):
        G.forward_packed(lay, G.StatePool(CFG, 2, dtype=torch.float16, device=DEVICE), x, cu, 0, [0])
    with pytest.raises(E.InputShapeError, match="state dimensions"):
        G.forward_packed(lay, G.StatePool(tiny_config(Hk=2, Hv=4, dk=8, dv=8, D=32, I=48), 2, dtype=torch.bfloat16,
                                          device=DEVICE), x, cu, 0, [0])
    pool = G.StatePool.for_layer(lay, 3)
    pool.seq_len.fill_(4)
    pool.free([2])
    assert pool.seq_len.tolist() == [4, 4, 0]
    with pytest.raises(E.SlotIndexError):
        pool.free([3])
    with pytest.raises(E.SlotIndexError):  # the padding id names no slot: refused, nothing freed
        pool.free([PAD_SLOT_ID, 0])
    assert pool.seq_len.tolist() == [4, 4, 0]


# --- the device layout: no host read, grids from shapes -------------------------------------------
def meta_call(fn, lengths, device_layout: bool, **kw):
    """A serving call at Qwen3.5 sizes on meta tensors: launches recorded (nothing runs), host traffic too."""
    lay = Layer.shaped(REAL, profile="bf16")
    pool = G.StatePool.for_layer(lay, 2 * len(lengths))
    cu = np.concatenate([[0], np.cumsum(lengths)])
    slots = np.arange(len(lengths))[::-1].copy()
    slots[0] = PAD_SLOT_ID
    x = torch.empty((int(cu[-1]), REAL.hidden_size), dtype=torch.bfloat16, device="meta")
    layout = (cu, np.full(len(lengths), 7), slots)
    if device_layout:
        layout = tuple(torch.empty(len(a), dtype=torch.int64, device="meta") for a in layout)
    with record_launches() as launches, HostTraffic() as traffic:
        fn(lay, pool, x, *layout, **kw)
    return traffic, launches


@pytest.mark.parametrize("lengths", [[1] * 64, [3000, 1, 700, 1, 2048, 1500, 900, 43]], ids=["decode", "mixed"])
@pytest.mark.parametrize("fn", [G.forward_packed, G.verify_spec], ids=["forward", "verify"])
def test_device_layout_reads_nothing_on_the_host(lengths, fn):
    traffic, launches = meta_call(fn, lengths, device_layout=True)
    assert traffic.reads == [] and traffic.copies == []
    kernels = {launch.kernel for launch in launches}
    assert "slot_rule_kernel" in kernels and "conv1d_qk_norm_kernel" in kernels
    chunked = fn is G.forward_packed and len(lengths) == 8  # the bound 8000 - 8 + 1 > 16
    assert ("chunk_state_kernel" in kernels) == chunked
    traffic, _ = meta_call(fn, lengths, device_layout=False)  # host values: one copy, the whole layout
    assert traffic.reads == [] and traffic.copies == [("cpu", "meta")]


def test_packed_grids_stay_inside_cuda_limits():
    for lengths in ([1] * 4096, [64] * 512):
        _, launches = meta_call(G.forward_packed, lengths, device_layout=True)
        for launch in launches:
            assert all(1 <= g <= lim for g, lim in zip(launch.grid, GRID_LIMITS)), launch


def test_device_chunk_map_and_steps_equal_the_host_ones():
    cu = torch.tensor([0, 1, 17, 33, 38, 39])
    lengths = np.diff(cu.numpy())
    cu_chunks, order = chunk_map(cu, CHUNK)
    assert cu_chunks.tolist() == [0, 1, 2, 3, 4, 5] and chunk_bound(39, 5, CHUNK) == 7
    assert lengths[order.numpy()].tolist() == sorted(lengths, reverse=True)
    assert chunk_map(cu, 4)[0].tolist() == [0, 1, 5, 9, 11, 12]
    steps = every_token(cu, 39)
    assert steps.seq.tolist() == np.repeat(np.arange(5), lengths).tolist()
    assert steps.off.tolist() == [j for n in lengths for j in range(1, n + 1)] and steps.dst.tolist() == list(range(39))


def test_chunked_programs_past_the_last_chunk_change_nothing():
    """A device layout launches the bound on the chunk count: the extra programs write nothing, so the
    result equals the exact launch bit for bit (and the state of each slot)."""
    rng = rng_for("bound")
    lengths, Hk, Hv, d = [1, 17, 16, 5], 1, 2, 16
    total = sum(lengths)
    def t(a):
        return torch.tensor(a, dtype=torch.float32, device=DEVICE)

    q, k = (torch.nn.functional.normalize(t(rng.normal(size=(1, total, Hk, d))), dim=-1) for _ in range(2))
    v, g = t(rng.normal(size=(1, total, Hv, d))), t(-rng.uniform(0, 1, size=(1, total, Hv)))
    beta = t(rng.uniform(0, 1, size=(1, total, Hv)))
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), device=DEVICE)
    cu_chunks, order = chunk_map(cu, CHUNK)
    slots = torch.tensor([2, 0, PAD_SLOT_ID, 3], device=DEVICE)
    start = t(rng_for("pool").normal(size=(4, Hv, d, d)))
    results = []
    for n_chunks in (int(cu_chunks[-1]), chunk_bound(total, len(lengths), CHUNK)):
        pool = start.clone()
        layout = Packed(cu, slots, None, total, max(lengths), CHUNK, cu_chunks, n_chunks, order)
        results.append((delta_rule_chunked_packed(q, k, v, g, beta, pool, None, layout), pool))
    assert n_chunks == 6 > int(cu_chunks[-1]) == 5  # one program per head past the last chunk
    assert results[1][0].shape == (1, total, Hv, d) and not torch.isnan(results[1][0]).any()
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    assert torch.equal(results[1][1][1], start[1])  # the slot no sequence names


@pytest.mark.parametrize("profile", ["bf16", "f32"])
def test_memory_model_of_a_packed_call(profile, monkeypatch):
    """The peak of a packed prefill (kernels recorded, not run: the allocations are the same) against
    gpu_impl/memory.py's model, with a temporaries budget small enough to slice the heads; and what a
    verify keeps."""
    import importlib

    chunked = importlib.import_module("gdncheck.gpu_impl.delta_rule_chunked")
    lengths, budget = [300, 17, 1, 322], 500_000  # 230 KB per head: two heads per slice
    monkeypatch.setattr(chunked, "TEMP_BUDGET", budget)
    lay = Layer(CFG, WEIGHTS, profile=profile, device="cpu", chunk_size=64)
    pool = G.StatePool.for_layer(lay, 4)
    x = torch.zeros(sum(lengths), CFG.hidden_size, dtype=lay.dtype)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    with record_launches():
        measured = peak_allocated(lambda: G.forward_packed(lay, pool, x, cu, 0, [0, 1, 2, 3]))
        _, _, spec = G.verify_spec(lay, pool, x[:8], [0, 4, 8], 0, [0, 1])
    model = M.packed_peak(CFG, sum(lengths), len(lengths), profile, chunk=64, budget=budget)
    assert 0 < model.temporaries <= budget < CFG.num_v_heads * sum(lengths) * 4 * (2 + 16 + 8 + 64)  # sliced
    assert abs(measured - model.bytes) <= 0.03 * model.bytes + 16384, (measured, model)
    kept = spec.conv_state_steps.nbytes + spec.recurrent_state_steps.nbytes
    assert kept == M.verify_steps_bytes(CFG, 8, profile)
    assert M.verify_steps_bytes(REAL, 1, "bf16") == 8192 * 4 * 2 + 32 * 128 * 128 * 4


@pytest.mark.gpu
def test_packed_decode_replays_in_a_cuda_graph():
    """A decode step on a layout held on the device (offsets, positions, slots with a padding entry),
    captured once and replayed, equals the same steps run plainly."""
    lay = layer("bf16")
    plain, graphed = G.StatePool.for_layer(lay, POOL), G.StatePool.for_layer(lay, POOL)
    x = torch.tensor(make_inputs(CFG, 4, 6, seed=14), dtype=torch.bfloat16, device="cuda")
    slots, cu = torch.tensor([5, PAD_SLOT_ID, 2, 7], device="cuda"), torch.arange(5, device="cuda")
    pos = torch.zeros(4, dtype=torch.int64, device="cuda")
    static_x = x[:, 0].clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile outside the capture
        G.forward_packed(lay, G.StatePool.for_layer(lay, POOL), static_x, cu, pos, slots)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, _ = G.forward_packed(lay, graphed, static_x, cu, pos, slots)
    for step in range(6):
        want, _ = G.forward_packed(lay, plain, x[:, step], [0, 1, 2, 3, 4], [step, 0, step, step], [5, -1, 2, 7])
        static_x.copy_(x[:, step])
        pos.copy_(torch.tensor([step, 0, step, step]))
        graph.replay()
        check(static_out, want, "forms", "bf16", f"graph replay, step {step}")
    check(graphed.recurrent_state, plain.recurrent_state, "forms", "bf16", "pool after the replays")
    assert graphed.seq_len.tolist() == plain.seq_len.tolist() == [0, 0, 6, 0, 0, 6, 0, 6]
