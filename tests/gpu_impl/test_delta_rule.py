"""The delta rule on the Triton path: the fused recurrent kernel and the chunked WY pipeline,
each against the float64 reference, and against each other, per profile.

Shapes: T ∈ {1, 15, 63, 64, 65, 100}, Hv/Hk ∈ {1, 2, 3, 4}, dk ≠ dv, chunk sizes 16/32/64, a
batch of 2 with different initial states, and real head dims 128. The ``*_wrong_*`` test shows
the same bound rejecting the known bug classes of this stage.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gdncheck.gpu_impl as G
import gdncheck.reference as R
from gdncheck.gpu_impl.delta_rule import recurrent_heads
from gdncheck.gpu_impl.target import record_launches
from tests.gpu_impl.compare import check, fails, to_np
from tests.gpu_impl.helpers import PROFILE_NAMES, fp32, rng_for, tensor
from tests.helpers import unit

# (T, Hk, Hv, dk, dv, chunk)
CASES = [
    (1, 1, 1, 16, 16, 64),
    (15, 2, 4, 16, 8, 16),
    (63, 1, 3, 8, 16, 32),
    (64, 1, 4, 16, 32, 64),
    (65, 2, 2, 32, 16, 64),
    (100, 1, 2, 4, 3, 16),
]


def case_id(c) -> str:
    return "T{}_Hk{}_Hv{}_dk{}_dv{}_C{}".format(*c)


def inputs(profile: str, T: int, Hk: int, Hv: int, dk: int, dv: int, B: int = 2, key=()):
    """q, k (unit rows) and v in the profile dtype; g, beta fp32 (as the gates kernel gives them);
    a different non-zero initial state per row. Decays span gentle to strong, as at HF init."""
    rng = rng_for("delta", profile, T, Hk, Hv, dk, dv, *key)
    q = tensor(unit(rng, B, T, Hk, dk), profile)
    k = tensor(unit(rng, B, T, Hk, dk), profile)
    v = tensor(rng.normal(size=(B, T, Hv, dv)), profile)
    g = fp32(-np.exp(rng.uniform(-4, 1.5, size=(B, T, Hv))))
    beta = fp32(rng.uniform(0, 1, size=(B, T, Hv)))
    S0 = fp32(rng.normal(size=(B, Hv, dk, dv)) * (1 + np.arange(B))[:, None, None, None])
    return q, k, v, g, beta, S0


def reference(q, k, v, g, beta, S0, scale=None):
    return R.delta_rule_recurrent(*(to_np(t) for t in (q, k, v, g, beta)), None if S0 is None else to_np(S0), scale)


@pytest.mark.parametrize("profile", PROFILE_NAMES)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_recurrent_and_chunked_against_reference(profile, case):
    T, Hk, Hv, dk, dv, C = case
    args = inputs(profile, T, Hk, Hv, dk, dv)
    ref_core, ref_S = reference(*args)
    core_r, S_r = G.delta_rule_recurrent(*args)
    core_c, S_c = G.delta_rule_chunked(*args, chunk_size=C)
    assert core_r.dtype == core_c.dtype == args[2].dtype and S_r.dtype == S_c.dtype == torch.float32
    check(core_r, ref_core, "stage", profile, f"core recurrent {case_id(case)}")
    check(S_r, ref_S, "stage", profile, f"state recurrent {case_id(case)}")
    check(core_c, ref_core, "stage", profile, f"core chunked {case_id(case)}")
    check(S_c, ref_S, "stage", profile, f"state chunked {case_id(case)}")
    # the two Triton forms against each other: same inputs, both fp32 inside, the chunked form's
    # dots at the profile's precision (tf32 in bf16)
    check(core_c, core_r, "forms", profile, f"core chunked vs recurrent {case_id(case)}")
    check(S_c, S_r, "state_forms", profile, f"state chunked vs recurrent {case_id(case)}")


@pytest.mark.parametrize("heads", [1, 2, 4])
@pytest.mark.parametrize("case", [(15, 2, 6, 16, 8), (9, 1, 3, 8, 16), (5, 2, 2, 128, 128)],
                         ids=lambda c: case_id(c + (0,)))
def test_recurrent_value_heads_per_program(heads, case):
    """The recurrent kernel with 1 value head per program (the GPU's form), 2 and 4 (the
    interpreter's form: heads side by side on the value axis; 3 and 6 heads leave a group part
    empty, dk = dv = 128 is Qwen3.5's head), with an initial state, a reset row and in place: each
    against the reference."""
    T, Hk, Hv, dk, dv = case
    q, k, v, g, beta, S0 = inputs("bf16", T, Hk, Hv, dk, dv, B=2, key=("heads", heads))
    reset = torch.tensor([False, True], device=q.device)
    ref_core, ref_S = reference(q, k, v, g, beta, torch.stack([S0[0], torch.zeros_like(S0[1])]))
    S = S0.clone()
    core, S_out = G.delta_rule_recurrent(q, k, v, g, beta, S, out_state=S, reset=reset, heads_per_program=heads)
    assert S_out is S
    check(core, ref_core, "stage", "bf16", f"core, {heads} heads per program")
    check(S, ref_S, "stage", "bf16", f"state, {heads} heads per program")


def test_recurrent_heads_per_program_grid():
    """One head per program on a GPU (recorded launches take the GPU's parameters), every head of
    the layer in one interpreted program while its state slice fits (16 of Qwen3.5's 128 × 128);
    with several heads per program, groups run over the batch's (row, head) pairs: 2 rows of 6
    heads in 4s are 3 programs (the second straddles the rows), not 2 · 2."""
    q, k, v, g, beta, S0 = inputs("f32", 3, 1, 6, 16, 8, B=2)
    with record_launches() as launches:
        G.delta_rule_recurrent(q, k, v, g, beta, S0)
        G.delta_rule_recurrent(q, k, v, g, beta, S0, heads_per_program=4)
    assert [(x.grid, x.args["HB"], x.args.get("NBH")) for x in launches] == [((12, 1), 1, None), ((3, 1), 4, 12)]
    host = v.cpu()  # the interpreter's form: tensors on the CPU
    assert recurrent_heads(host, 6, 16, 8) == 8 and recurrent_heads(host, 48, 128, 128) == 16
    with pytest.raises(ValueError, match="power of two, found 3"):
        G.delta_rule_recurrent(q, k, v, g, beta, S0, heads_per_program=3)


@pytest.mark.parametrize("chunk", [16, 32, 64])
def test_chunk_sizes_and_no_initial_state(chunk):
    T, Hk, Hv, dk, dv = 100, 2, 6, 16, 8
    q, k, v, g, beta, _ = inputs("f32", T, Hk, Hv, dk, dv, key=("C", chunk))
    ref_core, ref_S = R.delta_rule_chunked(*(to_np(t) for t in (q, k, v, g, beta)), None, None, chunk)
    core, S = G.delta_rule_chunked(q, k, v, g, beta, None, None, chunk)
    check(core, ref_core, "stage", "f32", f"core C={chunk}")
    check(S, ref_S, "stage", "f32", f"state C={chunk}")


def test_real_head_dims():
    T, Hk, Hv, dk, dv = 65, 1, 2, 128, 128
    args = inputs("bf16", T, Hk, Hv, dk, dv, B=1)
    ref_core, ref_S = reference(*args)
    for name, (core, S) in {"recurrent": G.delta_rule_recurrent(*args),
                            "chunked": G.delta_rule_chunked(*args, chunk_size=64)}.items():
        check(core, ref_core, "stage", "bf16", f"core {name} dk=dv=128")
        check(S, ref_S, "stage", "bf16", f"state {name} dk=dv=128")


def test_hard_inputs_correlated_keys_and_strong_decay():
    """Nearly parallel keys with beta ≈ 1 (an ill-conditioned UT system whose power series would
    cancel catastrophically), then decays of up to e^-25 per token (huge chunk log-decays)."""
    rng = rng_for("hard")
    B, T, Hk, Hv, dk, dv = 1, 128, 1, 2, 16, 16
    base = rng.normal(size=dk)
    k = unit(rng, B, T, Hk, dk) * 0.05 + base
    k = fp32(k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6))
    q, v = fp32(unit(rng, B, T, Hk, dk)), fp32(rng.normal(size=(B, T, Hv, dv)))
    for g_np, beta_np in [(np.full((B, T, Hv), -1e-3), np.full((B, T, Hv), 0.99)),
                          (-rng.uniform(0, 25, size=(B, T, Hv)), rng.uniform(0, 1, size=(B, T, Hv)))]:
        g, beta = fp32(g_np), fp32(beta_np)
        ref_core, ref_S = reference(q, k, v, g, beta, None)
        core, S = G.delta_rule_chunked(q, k, v, g, beta, None, None, 64)
        check(core, ref_core, "stage", "f32", "core chunked, hard inputs")
        check(S, ref_S, "stage", "f32", "state chunked, hard inputs")


def test_in_place_state_update():
    T, Hk, Hv, dk, dv = 40, 1, 2, 16, 8
    q, k, v, g, beta, S0 = inputs("f32", T, Hk, Hv, dk, dv)
    ref_core, ref_S = reference(q, k, v, g, beta, S0)
    for fn in (G.delta_rule_recurrent, G.delta_rule_chunked):
        S = S0.clone()
        core, S_out = fn(q, k, v, g, beta, S, out_state=S)
        assert S_out is S
        check(S, ref_S, "stage", "f32", f"state in place ({fn.__name__})")
        check(core, ref_core, "stage", "f32", f"core, state in place ({fn.__name__})")


def test_wrong_variants_are_rejected():
    """Tiled instead of interleaved heads, missing scale, lost initial state, transposed state,
    beta not applied:
    each through the correct kernels with the bug applied to its inputs, judged by the bound of
    the loosest profile (bf16)."""
    T, Hk, Hv, dk, dv = 20, 2, 4, 16, 16
    q, k, v, g, beta, S0 = inputs("bf16", T, Hk, Hv, dk, dv)
    ref_core, ref_S = reference(q, k, v, g, beta, S0)
    tile = [j % Hk for j in range(Hv)]  # value head j reads key head j % Hk (torch.tile)
    wrong = {
        "tiled heads": G.delta_rule_chunked(q[:, :, tile], k[:, :, tile], v, g, beta, S0, chunk_size=16),
        "no scale": G.delta_rule_chunked(q, k, v, g, beta, S0, 1.0, 16),
        "lost initial state": G.delta_rule_recurrent(q, k, v, g, beta, None),
        "transposed state": G.delta_rule_recurrent(q, k, v, g, beta, S0.transpose(-1, -2).contiguous()),
        "beta not applied": G.delta_rule_recurrent(q, k, v, g, torch.ones_like(beta), S0),
    }
    ratios = {name: fails(core, ref_core, "stage", "bf16") for name, (core, _) in wrong.items()}
    assert min(ratios.values()) > 3, ratios
