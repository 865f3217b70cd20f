"""Every Triton stage function against its float64 reference stage, per precision profile.

Inputs are drawn in float64 and rounded to the profile dtype; the reference gets the very same
(rounded) values, so the error measured is the stage's own. Each ``*_wrong_*`` test feeds a known
bug class through the same kernels and shows that the same bound rejects it.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

import gdncheck.gpu_impl as G
import gdncheck.reference as R
from gdncheck.gpu_impl.target import record_launches
from tests.gpu_impl.compare import check, fails, to_np
from tests.gpu_impl.helpers import PROFILE_NAMES, fp32, rng_for, tensor

conv1d_module = importlib.import_module("gdncheck.gpu_impl.conv1d")  # (the package exports a function conv1d)
EPS = 1e-6


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_input_norm_post_norm_and_fused_residual(profile):
    rng = rng_for("norm", profile)
    x = tensor(rng.normal(size=(2, 23, 40)) * 3, profile)
    a = tensor(rng.normal(size=(2, 23, 40)), profile)
    w = fp32(rng.normal(size=40) * 0.1)
    check(G.input_norm(x, w, EPS), R.input_norm(to_np(x), to_np(w), EPS), "stage", profile, "x_norm")
    check(G.post_norm(x, w, EPS), R.post_norm(to_np(x), to_np(w), EPS), "stage", profile, "h_norm")
    h, h_norm = G.residual_post_norm(x, a, w, EPS)
    check(h, R.residual(to_np(x), to_np(a)), "stage", profile, "h (fused)")
    # the fused norm reads the rounded h: compare with the reference stage applied to that h
    check(h_norm, R.post_norm(to_np(h), to_np(w), EPS), "stage", profile, "h_norm (fused)")
    check(G.residual(x, a), R.residual(to_np(x), to_np(a)), "stage", profile, "h")
    check(G.output(x, a), R.output(to_np(x), to_np(a)), "stage", profile, "out")


def test_input_norm_wrong_weight_convention_is_rejected():
    """(1 + w) vs w: a port applying the weight as given is off by O(1)."""
    rng = rng_for("norm-wrong")
    x, w = tensor(rng.normal(size=(1, 9, 40)), "bf16"), fp32(rng.normal(size=40) * 0.1)
    assert fails(G.input_norm(x, w - 1.0, EPS), R.input_norm(to_np(x), to_np(w), EPS), "stage", "bf16") > 10


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_in_proj_out_proj_mlp(profile):
    rng = rng_for("proj", profile)
    D, C, Hv, dv, I = 24, 40, 3, 8, 20
    x = tensor(rng.normal(size=(2, 7, D)), profile)
    ws = [tensor(rng.normal(size=s) * 0.2, profile) for s in ((C, D), (Hv * dv, D), (Hv, D), (Hv, D))]
    got = G.in_proj(x, *ws)
    want = R.in_proj(to_np(x), *(to_np(w) for w in ws))
    for name, g_, w_ in zip(("qkv", "z", "a", "b"), got, want):
        check(g_, w_, "stage", profile, name)
    core = tensor(rng.normal(size=(2, 7, Hv, dv)), profile)
    w_out = tensor(rng.normal(size=(D, Hv * dv)) * 0.2, profile)
    check(G.out_proj(core, w_out), R.out_proj(to_np(core), to_np(w_out)), "stage", profile, "attn_out")
    wg, wu, wd = (tensor(rng.normal(size=s) * 0.2, profile) for s in ((I, D), (I, D), (D, I)))
    check(G.mlp(x, wg, wu, wd), R.mlp(*(to_np(t) for t in (x, wg, wu, wd))), "stage", profile, "mlp_out")


CONV_CASES = [  # (Hk, dk, Hv, dv, K, T)
    (2, 16, 4, 8, 4, 23),
    (1, 8, 3, 16, 3, 2),  # T < K - 1: the new state keeps old columns; K not a power of two
    (1, 4, 1, 4, 4, 70),
]


@pytest.mark.parametrize("profile", PROFILE_NAMES)
@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "Hk{}_dk{}_Hv{}_dv{}_K{}_T{}".format(*c))
def test_conv1d_and_qk_norm(profile, case):
    Hk, dk, Hv, dv, K, T = case
    C = 2 * Hk * dk + Hv * dv
    rng = rng_for("conv", profile, case)
    # qkv as a strided view of a wider in_proj output, as in the layer
    wide = tensor(rng.normal(size=(2, T, C + 5)), profile)
    qkv = wide[..., :C]
    state = tensor(rng.normal(size=(2, C, K)), profile)
    w = tensor(rng.uniform(-0.5, 0.5, size=(C, 1, K)), profile)
    ref_conv, ref_state = R.conv1d(to_np(qkv), to_np(state), to_np(w))
    conv, new_state = G.conv1d(qkv, state, w)
    check(conv, ref_conv, "stage", profile, "qkv_conv")
    assert torch.equal(new_state, tensor(ref_state, profile)), "new conv state: columns are copied, exactly"
    ref_q, ref_k, ref_v = R.qk_norm(to_np(conv), Hk, dk, Hv, dv)
    for name, got, want in zip("qkv", G.qk_norm(conv, Hk, dk, Hv, dv), (ref_q, ref_k, ref_v)):
        check(got, want, "stage", profile, name)
    # the fused production kernel: conv + SiLU + L2 norm of q and k, qkv_conv stored on request; one
    # head slot per program (the GPU's form), two (the last group part empty when 2·Hk + Hv is odd),
    # and every slot in one program (the interpreter's)
    fq, fk, fv = R.qk_norm(ref_conv, Hk, dk, Hv, dv)
    for heads in (1, 2, None):
        q, k, v, conv2, state2 = G.conv1d_qk_norm(qkv, state, w, Hk, dk, Hv, dv, capture=True,
                                                  heads_per_program=heads)
        assert torch.equal(conv2, conv) and torch.equal(state2, new_state), f"heads_per_program={heads}"
        for name, got, want in zip("qkv", (q, k, v), (fq, fk, fv)):
            check(got, want, "stage", profile, f"{name} (fused, heads_per_program={heads})")


@pytest.mark.parametrize("heads", [1, 2, None])
def test_conv1d_qk_norm_token_blocks(heads, monkeypatch):
    """Under the interpreter a call's tokens are normally one block (one program); cut into blocks of
    1 to 8 tokens (a smaller tile budget: 23 tokens, the last block partial), the fused kernel gives the
    same bits, and the last block alone writes the new state."""
    Hk, dk, Hv, dv, K, T = CONV_CASES[0]
    C = 2 * Hk * dk + Hv * dv
    rng = rng_for("conv-blocks", heads)
    qkv = tensor(rng.normal(size=(2, T, C)), "f32")
    state = tensor(rng.normal(size=(2, C, K)), "f32")
    w = tensor(rng.uniform(-0.5, 0.5, size=(C, 1, K)), "f32")
    whole = G.conv1d_qk_norm(qkv, state, w, Hk, dk, Hv, dv, capture=True, heads_per_program=heads)
    width = (heads or 8) * 16  # head slots per program x BD (8 slots of 16 lanes in the interpreter's form)
    assert conv1d_module._token_block(qkv, T, width) >= T
    monkeypatch.setattr(conv1d_module, "_INTERPRETER_TILE", 128)
    assert conv1d_module._token_block(qkv, T, width) <= 8
    cut = G.conv1d_qk_norm(qkv, state, w, Hk, dk, Hv, dv, capture=True, heads_per_program=heads)
    for name, a, b in zip(("q", "k", "v", "qkv_conv", "state"), whole, cut):
        assert torch.equal(a, b), f"{name}: token blocks of a 128-element tile differ from one block"
    ref_conv, ref_state = R.conv1d(to_np(qkv), to_np(state), to_np(w))
    check(cut[3], ref_conv, "stage", "f32", "qkv_conv (token blocks)")
    assert torch.equal(cut[4], tensor(ref_state, "f32"))


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_conv1d_update_in_place(profile):
    Hk, dk, Hv, dv, K = 2, 16, 4, 8, 4
    C = 2 * Hk * dk + Hv * dv
    rng = rng_for("conv-update", profile)
    x = tensor(rng.normal(size=(3, 1, C)), profile)
    state = tensor(rng.normal(size=(3, C, K)), profile)
    w = tensor(rng.uniform(-0.5, 0.5, size=(C, 1, K)), profile)
    ref_conv, ref_state = R.conv1d(to_np(x), to_np(state), to_np(w))
    s1 = state.clone()
    check(G.conv1d_update(x, s1, w), ref_conv, "stage", profile, "qkv_conv (update)")
    assert torch.equal(s1, tensor(ref_state, profile))
    for heads in (1, None):
        s2 = state.clone()
        q, k, v, _, s2_out = G.conv1d_qk_norm(x, s2, w, Hk, dk, Hv, dv, inplace=True, heads_per_program=heads)
        assert s2_out is s2 and torch.equal(s2, s1), f"heads_per_program={heads}"
        check(q, R.qk_norm(ref_conv, Hk, dk, Hv, dv)[0], "stage", profile, f"q (fused update, {heads})")
        check(v, R.qk_norm(ref_conv, Hk, dk, Hv, dv)[2], "stage", profile, f"v (fused update, {heads})")


@pytest.mark.parametrize("heads,programs", [(1, 11), (2, 6), (4, 3), (None, 11)])
def test_heads_per_program_sets_the_grid(heads, programs):
    """11 head slots (2·Hk + Hv = 4 + 7) in groups of a power of two; by default one program each in
    what a GPU launches (recorded launches take the GPU's parameters), and every slot in one
    program of 16 slots' lanes in the interpreter."""
    Hk, dk, Hv, dv, K, C = 2, 16, 7, 8, 4, 2 * 2 * 16 + 7 * 8
    x = tensor(np.zeros((1, 5, C)), "f32")
    with record_launches() as launches:
        G.conv1d_qk_norm(x, tensor(np.zeros((1, C, K)), "f32"), tensor(np.zeros((C, 1, K)), "f32"), Hk, dk, Hv, dv,
                         heads_per_program=heads)
    (launch,) = launches
    assert launch.grid[1] == programs and launch.args["HB"] == (heads or 1)
    assert conv1d_module._heads_per_program(x.cpu(), 2 * Hk + Hv, 16, None) == 16  # interpreted: one program


def test_heads_per_program_must_be_a_power_of_two():
    x = tensor(np.zeros((1, 1, 16)), "f32")
    with pytest.raises(ValueError, match="power of two, found 3"):
        G.conv1d_qk_norm(x, tensor(np.zeros((1, 16, 4)), "f32"), tensor(np.zeros((16, 1, 4)), "f32"), 1, 4, 2, 4,
                         heads_per_program=3)


def test_conv1d_wrong_state_shift_and_split_order_are_rejected():
    Hk, dk, Hv, dv, K, T = 2, 16, 4, 8, 4, 5
    C = 2 * Hk * dk + Hv * dv
    rng = rng_for("conv-wrong")
    qkv, state = tensor(rng.normal(size=(1, T, C)), "bf16"), tensor(rng.normal(size=(1, C, K)), "bf16")
    w = tensor(rng.uniform(-0.5, 0.5, size=(C, 1, K)), "bf16")
    ref_conv, _ = R.conv1d(to_np(qkv), to_np(state), to_np(w))
    shifted = torch.roll(state, 1, dims=-1)  # conv state off by one column
    assert fails(G.conv1d(qkv, shifted, w)[0][:, : K - 1], ref_conv[:, : K - 1], "stage", "bf16") > 10
    conv = tensor(ref_conv, "bf16")
    swapped = torch.cat([conv[..., Hk * dk:2 * Hk * dk], conv[..., :Hk * dk], conv[..., 2 * Hk * dk:]], -1)
    ref_q = R.qk_norm(ref_conv, Hk, dk, Hv, dv)[0]
    assert fails(G.qk_norm(swapped, Hk, dk, Hv, dv)[0], ref_q, "stage", "bf16") > 10  # K|Q instead of Q|K


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_gates(profile):
    rng = rng_for("gates", profile)
    Hv = 5
    a = rng.normal(size=(2, 11, Hv)) * 4
    a[0, 0, :3] = [-60.0, 25.0, 0.0]  # softplus tails and zero
    a, b = tensor(a, profile), tensor(rng.normal(size=(2, 11, Hv)) * 4, profile)
    A_log, dt_bias = fp32(np.log(rng.uniform(0.01, 16, Hv))), fp32(rng.normal(size=Hv))
    g, beta = G.gates(a, b, A_log, dt_bias)
    assert g.dtype == beta.dtype == torch.float32
    ref_g, ref_beta = R.gates(to_np(a), to_np(b), to_np(A_log), to_np(dt_bias))
    # g and beta are fp32 in every profile: the f32 bound applies
    check(g, ref_g, "stage", "f32", f"g ({profile} inputs)")
    check(beta, ref_beta, "stage", "f32", f"beta ({profile} inputs)")
    assert fails(G.gates(b, a, A_log, dt_bias)[0], ref_g, "stage", "f32") > 10  # a and b swapped


@pytest.mark.parametrize("profile", PROFILE_NAMES)
@pytest.mark.parametrize("norm_mode", ["shared", "per_head"])
def test_gated_norm(profile, norm_mode):
    rng = rng_for("gated-norm", profile, norm_mode)
    Hv, dv = 3, 8
    core = tensor(rng.normal(size=(2, 9, Hv, dv)), profile)
    z = tensor(rng.normal(size=(2, 9, Hv * dv + 4)) * 2, profile)[..., : Hv * dv].unflatten(-1, (Hv, dv))
    w = fp32(1.0 + rng.normal(size=dv if norm_mode == "shared" else Hv * dv) * 0.1)
    ref = R.gated_norm(to_np(core), to_np(z), to_np(w), EPS)
    check(G.gated_norm(core, z, w, EPS), ref, "stage", profile, "core_gated")
    assert fails(G.gated_norm(core, z, w + 1.0, EPS), ref, "stage", profile) > 10  # 1 + w instead of w
