"""Index arithmetic past 2**31 elements: the serving calls of the Triton path where a 32-bit element
offset would wrap (docs/gpu.md §13).

A kernel that forms a pointer offset in 32 bits — a token's row times the channel count, a slot
index times the state's size — is right on every fixture of the suite and wrong on a real serving
batch. On a GPU (``large_index`` marker: scripts/gpu_check.sh and the GPU workflow run it), at
Qwen3.5's real sizes in bf16:

- a packed prefill of 540,672 tokens: qkv [T, 8192] and the conv output hold 4.4e9 elements, the
  delta rule's core [T, 32 · 128] 2.2e9, the MLP's gate/up [T, 12288] 6.6e9;
- a pool of 4100 slots: slot s's recurrent state starts at element s · 524,288, past 2**31 from slot
  4096 on (8.6 GB of fp32 state);
- the call patterns an engine makes there: the packed prefill (its last sequences on the highest
  slots), a decode batch, a speculative verify and commit, a prefix snapshot into the highest slot.

Judged by sampling: the sequences packed last and the highest slots against the float64 reference
of those rows alone (their inputs and entering states copied to the host), within the layer bound.
The sequences before them only fill the call; they are checked finite. Memory: the peak the test
records in its JUnit properties (``peak_gpu_GB``; scripts/gpu_check.sh lists it), docs/gpu.md §13.

On the CPU (CI, ``scripts/gpu_check.sh --dry-run``) the same steps at a small size, interpreted,
with the same sampling: it checks the test itself, not the offsets.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

import gdncheck.reference as R
from gdncheck.config import REAL, GDNConfig
from gdncheck.gpu_impl import Layer
from gdncheck.gpu_impl import serving as G
from gdncheck.reference import serving as RS
from gdncheck.synthetic import make_weights
from tests.gpu_impl.compare import check
from tests.gpu_impl.helpers import DEVICE, rng_for
from tests.helpers import tiny_config

pytestmark = pytest.mark.large_index

WRAP = 2**31


@dataclass(frozen=True)
class Plan:
    """One size of the family: the layer, the pool, the packed call's filler and judged sequences."""

    cfg: GDNConfig
    pool: int
    filler: tuple[int, ...]  # lengths of the sequences packed first (not judged: they make the call large)
    judged: tuple[int, ...]  # lengths of the sequences packed last, on the highest slots
    chunk: int

    @property
    def total(self) -> int:
        return sum(self.filler) + sum(self.judged)

    def slots(self) -> list[int]:
        """Fillers on the lowest slots, the judged sequences on the highest."""
        n = len(self.judged)
        return list(range(len(self.filler))) + list(range(self.pool - n, self.pool))

    def state_elements(self) -> int:
        c = self.cfg
        return c.num_v_heads * c.head_k_dim * c.head_v_dim


#: the GPU's size: the judged sequences are a decode (1), a chunk's inside, a chunk and one token
GPU = Plan(REAL, pool=WRAP // (32 * 128 * 128) + 4, filler=(131_072,) * 4 + (16_384,),
           judged=(1, 37, 64, 65), chunk=64)
#: the dry run's: the same steps, interpreted
DRY = Plan(tiny_config(Hk=2, Hv=4, dk=16, dv=8, D=32, I=48), pool=8, filler=(40, 23), judged=(1, 5, 16, 17),
           chunk=16)
PLAN = GPU if DEVICE.type == "cuda" else DRY
PROFILE = "bf16"


def test_the_gpu_size_passes_2_31_where_it_says():
    """The GPU plan's tensors and offsets are past 2**31 elements (a shrunk plan would test nothing)."""
    c, p = GPU.cfg, GPU
    assert p.total * c.conv_dim > WRAP  # qkv, the conv output
    assert p.total * c.num_v_heads * c.head_v_dim > WRAP  # core, core_gated
    assert p.total * 2 * c.intermediate_size > WRAP  # the MLP's gate/up
    highest = p.slots()[-len(p.judged):]
    assert min(highest) * p.state_elements() >= WRAP  # each judged slot's recurrent state starts past it
    assert p.pool * p.state_elements() * 4 < 10e9  # the pool's fp32 state: under 10 GB


@pytest.fixture(scope="module")
def setup():
    p = PLAN
    w = make_weights(p.cfg, seed=31)
    layer = Layer(p.cfg, w, profile=PROFILE, device=DEVICE, chunk_size=p.chunk)
    ref_layer = R.Layer(p.cfg, w, chunk_size=p.chunk)
    if DEVICE.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    pool = G.StatePool.for_layer(layer, p.pool)
    rng = rng_for("large-index")
    # arbitrary entering states on the judged slots (the profile's dtypes), zeros elsewhere
    for s in p.slots()[len(p.filler):]:
        pool.conv_state[s] = torch.tensor(rng.normal(size=pool.conv_state.shape[1:]))
        pool.recurrent_state[s] = torch.tensor(rng.normal(scale=0.3, size=pool.recurrent_state.shape[1:]))
        pool.seq_len[s] = int(rng.integers(1, 300))
    return p, layer, ref_layer, pool


def _reference_pool(pool: G.StatePool, slots: list[int]) -> RS.StatePool:
    """A float64 pool of the given device slots alone, in their order."""
    ref = RS.StatePool(pool.cfg, len(slots))
    ref.conv_state[:] = pool.conv_state[slots].cpu().double().numpy()
    ref.recurrent_state[:] = pool.recurrent_state[slots].cpu().double().numpy()
    ref.seq_len[:] = pool.seq_len[slots].cpu().numpy()
    return ref


def _x(total: int, D: int, seed: int) -> torch.Tensor:
    """[total, D] of N(0, 1) in bf16, made on the device (a host copy at the GPU size would be 9 GB)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    return torch.randn((total, D), generator=gen, device=DEVICE, dtype=torch.float32).to(torch.bfloat16)


def _judge_slots(pool, ref, slots, what):
    for i, s in enumerate(slots):
        check(pool.recurrent_state[s], ref.recurrent_state[i], "layer", PROFILE, f"{what}: recurrent state, slot {s}")
        check(pool.conv_state[s], ref.conv_state[i], "layer", PROFILE, f"{what}: conv state, slot {s}")
        assert int(pool.seq_len[s]) == int(ref.seq_len[i]), f"{what}: seq_len of slot {s}"


def test_packed_prefill_then_decode_verify_commit_and_a_snapshot_on_the_highest_slots(setup, record_property):
    p, layer, ref_layer, pool = setup
    slots = p.slots()
    judged_slots = slots[len(p.filler):]
    n_fill = len(p.filler)
    lengths = np.array(p.filler + p.judged, dtype=np.int64)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    pos = pool.seq_len[slots].cpu().numpy()
    x = _x(p.total, p.cfg.hidden_size, seed=1)

    # 1. the packed prefill: the judged sequences start past token 2**31 / conv_dim at the GPU size
    ref = _reference_pool(pool, judged_slots)
    out, _ = G.forward_packed(layer, pool, x, cu, pos, slots)
    start = int(cu[n_fill])
    x_judged = x[start:].float().cpu().double().numpy()
    ref_out, _ = RS.forward_packed(ref_layer, ref, x_judged, cu[n_fill:] - start, pos[n_fill:],
                                   list(range(len(p.judged))))
    assert tuple(out.shape) == (p.total, p.cfg.hidden_size)
    assert bool(torch.isfinite(out[:start]).all()), "a filler sequence's output is not finite"
    check(out[start:], ref_out.reshape(-1, p.cfg.hidden_size), "layer", PROFILE,
          "packed prefill: the sequences packed last")
    _judge_slots(pool, ref, judged_slots, "packed prefill")
    del out, x

    # 2. a decode step of the judged slots, in reverse order
    order = judged_slots[::-1]
    ref = _reference_pool(pool, order)
    xd = _x(len(order), p.cfg.hidden_size, seed=2)
    cu_d = np.arange(len(order) + 1, dtype=np.int64)
    pos_d = pool.seq_len[order].cpu().numpy()
    out, _ = G.forward_packed(layer, pool, xd, cu_d, pos_d, order)
    ref_out, _ = RS.forward_packed(ref_layer, ref, xd.float().cpu().double().numpy(), cu_d, pos_d,
                                   list(range(len(order))))
    check(out.reshape(len(order), -1), ref_out.reshape(len(order), -1), "layer", PROFILE, "decode on the highest slots")
    _judge_slots(pool, ref, order, "decode")

    # 3. speculative verify of 5 draft tokens on each judged slot, commit 0, 1, 3, 5 of them
    k = 5
    ref = _reference_pool(pool, judged_slots)
    xs = _x(k * len(judged_slots), p.cfg.hidden_size, seed=3)
    cu_s = np.arange(0, k * len(judged_slots) + 1, k, dtype=np.int64)
    pos_s = pool.seq_len[judged_slots].cpu().numpy()
    accepted = [0, 1, 3, 5][: len(judged_slots)]
    out, _, spec = G.verify_spec(layer, pool, xs, cu_s, pos_s, judged_slots)
    ref_out, _, ref_spec = RS.verify_spec(ref_layer, ref, xs.float().cpu().double().numpy(), cu_s, pos_s,
                                          list(range(len(judged_slots))))
    check(out.reshape(-1, p.cfg.hidden_size), ref_out.reshape(-1, p.cfg.hidden_size), "layer", PROFILE,
          "speculative verify on the highest slots")
    G.commit(spec, accepted)
    RS.commit(ref_spec, accepted)
    _judge_slots(pool, ref, judged_slots, "commit")

    # 4. a prefix snapshot into the highest slot: sequence 0 (on slot pool - 2) after 3 of its 7 tokens
    src, dst = judged_slots[-2], judged_slots[-1]
    ref = _reference_pool(pool, [src, dst])
    xp = _x(7, p.cfg.hidden_size, seed=4)
    pos_p = pool.seq_len[[src]].cpu().numpy()
    G.prefix_snapshots(layer, pool, xp, [0, 7], pos_p, [src], [0], [3], [dst])
    RS.prefix_snapshots(ref_layer, ref, xp.float().cpu().double().numpy(), [0, 7], pos_p, [0], [0], [3], [1])
    _judge_slots(pool, ref, [src, dst], "prefix snapshot")

    # the figures of the run, in its JUnit file (scripts/gpu_check.sh lists them)
    record_property("packed_tokens", p.total)
    record_property("pool_slots", p.pool)
    if DEVICE.type == "cuda":
        record_property("peak_gpu_GB", round(torch.cuda.max_memory_allocated() / 1e9, 1))
