"""The compile check (gdncheck/gpu_tools/compile_check.py): every launch of the Triton path built for
sm_90 as the JIT builds it, without a GPU: the quick plan, the test suite's own small shapes, the
sparse block's kernels at the real router width, the refusals (shared memory over the limit, spills)
and the plan's filters."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton.language as tl

import gdncheck.gpu_impl as G
from gdncheck.gpu_impl import Layer
from gdncheck.gpu_impl import moe as GM
from gdncheck.gpu_impl.target import kernel
from gdncheck.gpu_tools.compile_check import (
    PREFILL_SPILLS,
    SM90,
    Build,
    compile_only,
    ctas_per_sm,
    main,
    markdown,
    moe_plan,
    only,
    plan,
    run_plan,
    scenario,
    spill_allowance,
    table,
)
from tests.gpu_impl.compare import to_np
from tests.gpu_impl.helpers import PROFILE_NAMES, rng_for, tensor
from tests.gpu_impl.test_moe import _weights
from tests.helpers import tiny_config

CFG = tiny_config(Hk=2, Hv=4, dk=16, dv=8, D=32, I=48)


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
def test_compile_check_builds_what_the_jit_builds():
    """Decode at Qwen3.5 sizes in every profile and the bf16 prefill at T = 8192, built for sm_90
    through the JIT's own argument specialisation: T = 1 becomes a constant (the decode kernels
    are their own variants), no shared memory over 227 KB, no spill in the decode path, and the
    bf16 prefill's state kernel in one wave at B = 1, Hv = 32; and the bf16 serving calls (decode
    with slot indices at B = 64, a packed prefill) with no decode spill either."""
    compiler = run_plan(plan(quick=True))
    assert compiler.problems() == []
    builds = list(compiler.builds.values())
    decode = [b for b in builds if b.decode and b.kernel == "delta_rule_recurrent_kernel"
              and not b.params.get("VARLEN")]  # a packed decode's T is its token count
    assert decode and all("T" in b.specialised for b in decode)
    assert all(b.local_bytes == 0 for b in builds if b.decode)
    state = [b for b in builds if b.kernel == "chunk_state_kernel"]
    assert state and all(u["waves"] == 1 for b in state for u in b.uses if u["scenario"].startswith("layer")), \
        [b.uses for b in state]
    names = {b.kernel for b in builds}
    assert names == {"rms_norm_kernel", "conv1d_qk_norm_kernel", "gates_kernel", "chunk_wu_kernel",
                     "chunk_state_kernel", "delta_rule_recurrent_kernel", "gated_norm_kernel",
                     "residual_post_norm_kernel", "swiglu_kernel",
                     "slot_rule_kernel", "conv_window_kernel"}  # the serving calls (gpu_impl/serving.py)
    text = markdown(table(compiler))
    assert "| chunk_state_kernel |" in text and "Problems: none" in text


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
def test_every_kernel_compiles_at_test_sizes():
    """The test suite's own small shapes (what a GPU runner's test run compiles), every profile,
    chunks 16 and 64, capture on, and the stage functions the layer does not call."""
    with compile_only() as compiler:
        for profile, chunk in (("bf16", 64), ("f32", 16), ("f16", 16)):
            layer = Layer.shaped(CFG, profile=profile, chunk_size=chunk)
            x = torch.empty((2, 40, CFG.hidden_size), dtype=layer.dtype, device="meta")
            state = layer.new_state(2)
            layer.forward(x, state, 0, capture=True)  # chunked prefill, fused conv with capture
            layer.forward(x[:, :1], state, 40)  # decode: in-place conv and recurrent updates
            qkv = torch.empty((2, 3, CFG.conv_dim), dtype=layer.dtype, device="meta")
            G.conv1d(qkv, state.conv_state, layer.w_conv)
            G.conv1d_update(qkv[:, :1], state.conv_state, layer.w_conv)
            G.qk_norm(qkv, CFG.num_k_heads, CFG.head_k_dim, CFG.num_v_heads, CFG.head_v_dim)
            G.post_norm(qkv, torch.empty(CFG.conv_dim, device="meta"), 1e-6)
    assert compiler.problems() == []
    assert {b.kernel for b in compiler.builds.values()} == {
        "rms_norm_kernel", "conv1d_qk_norm_kernel", "gates_kernel", "chunk_wu_kernel", "chunk_state_kernel",
        "delta_rule_recurrent_kernel", "gated_norm_kernel", "residual_post_norm_kernel", "swiglu_kernel",
        "conv1d_kernel", "l2_norm_heads_kernel",
    }


@kernel
def _big_shared_kernel(p_x, p_y, N: tl.constexpr):
    o = tl.arange(0, N)
    a = tl.load(p_x + o[:, None] * N + o[None, :])
    tl.store(p_y + o[:, None] * N + o[None, :], tl.dot(a, a, input_precision="tf32"))


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
def test_compile_check_refuses_shared_memory_over_the_limit_and_decode_spills():
    x = torch.empty(256, 256, device="meta")
    with compile_only() as compiler, scenario(compiler, "oversized"):
        _big_shared_kernel[(1,)](p_x=x, p_y=x, N=256)  # two 256 x 256 fp32 operands: 512 KB
    [build] = compiler.builds.values()
    assert build.shared > SM90["smem_per_cta"]
    assert any("over sm_90's 232448 B (227 KB)" in p for p in compiler.problems())
    spilling = Build(kernel="k", params={}, specialised=[], regs=255, local_bytes=64, shared=0, num_warps=4,
                     ctas_per_sm=2, compile_s=0.0, uses=[{"scenario": "d", "grid": [1], "waves": 1, "decode": True}])
    assert spilling.problems() == ["k {}: 64 B of spills per thread in the decode path"]
    spilling.uses[0]["decode"] = False
    assert spilling.problems() == ["k {}: 64 B of spills per thread in the prefill path, over the 0 B allowed "
                                   "(PREFILL_SPILLS)"]


def test_prefill_spills_are_bounded_per_variant():
    """The prefill path may spill only where PREFILL_SPILLS says, and no more than it says."""
    def prefill(kernel, params, spill):
        return Build(kernel=kernel, params=params, specialised=[], regs=255, local_bytes=spill, shared=0,
                     num_warps=4, ctas_per_sm=2, compile_s=0.0,
                     uses=[{"scenario": "p", "grid": [1], "waves": 1, "decode": False}])

    state16 = {"BT": 64, "BK": 128, "BV": 16, "PREC": "tf32"}
    assert spill_allowance("chunk_state_kernel", state16) == 0  # the one-wave block of bf16 spills nothing
    assert prefill("chunk_state_kernel", state16, 16).problems()
    cap = PREFILL_SPILLS[("chunk_state_kernel", "tf32x3", 16)]
    f32 = {**state16, "PREC": "tf32x3"}
    assert 0 < cap and prefill("chunk_state_kernel", f32, cap).problems() == []
    assert "over the" in prefill("chunk_state_kernel", f32, cap + 8).problems()[0]
    assert spill_allowance("chunk_state_kernel", {**f32, "BV": 32}) == 0  # f32 takes BV = 16 alone
    assert spill_allowance("chunk_wu_kernel", {"PREC": "tf32"}) == 0
    # packed sequences start anywhere: Triton 3.6 spills 72 B there; the unpacked form still none
    assert spill_allowance("chunk_wu_kernel", {"PREC": "tf32", "VARLEN": True}) == 128
    assert spill_allowance("chunk_wu_kernel", {"PREC": "tf32", "VARLEN": False}) == 0
    assert spill_allowance("chunk_state_kernel", {"PREC": "tf32", "BV": 16, "VARLEN": True}) == 0
    assert 0 < spill_allowance("chunk_wu_kernel", {"PREC": "tf32x3"}) < 512
    assert prefill("conv1d_qk_norm_kernel", {"BT": 32}, 8).problems()  # no other prefill kernel may spill


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
def test_compile_check_filters_scenarios_and_kernels(capsys):
    steps = only(plan(tiny=True), "prefill")
    assert [s[0] for s in steps] == ["tiny layer bf16 prefill B=2 T=40", "tiny serving bf16 packed prefill 1+5+17+18",
                                     "tiny moe layer bf16 prefill B=2 T=40"]
    compiler = run_plan(steps[:1], kernels="^chunk_")
    assert {b.kernel for b in compiler.builds.values()} == {"chunk_wu_kernel", "chunk_state_kernel"}
    assert main(["--tiny", "--only", "no such scenario"]) == 2
    assert "no scenario of the plan matches" in capsys.readouterr().err


def test_occupancy_of_sm90():
    assert ctas_per_sm(255, 4, 42 * 1024) == 2  # the state kernel: 128 threads of 255 registers, 2 per SM
    assert ctas_per_sm(255, 4, 152 * 1024) == 1  # two pipeline stages: shared memory allows one
    assert ctas_per_sm(255, 8, 0) == 1 and ctas_per_sm(32, 4, 0) == 16 and ctas_per_sm(32, 1, 0) == 32
    assert ctas_per_sm(128, 8, 0) == 2  # 128 registers x 256 threads: half the register file each


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU run compiles every kernel for real")
@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
def test_every_moe_kernel_compiles_for_sm90():
    """The launches a GPU would make, at the real router width (E = 512, top 10), built for
    cuda:sm_90 with Triton's bundled ptxas; nothing runs. Every kernel in bf16 (production); in
    f32 and f16 the grouped GEMMs, whose tl.dot precision differs (tf32x3)."""
    E, k, D, Im, Is, N = 512, 10, 64, 32, 48, 40
    rng = rng_for("moe-compile")
    names = set()
    for profile in PROFILE_NAMES:
        w = _weights(rng, E, D, Im, Is, profile)
        h = tensor(rng.normal(size=(N, D)), profile)
        logits = tensor(rng.normal(size=(N, E)), profile)
        selected = torch.tensor(np.argsort(-to_np(logits), axis=-1)[:, :k].copy())
        weights = torch.full((N, k), 0.1)
        with compile_only() as done:
            GM.experts(h, weights, selected, w["w_gate"], w["w_up"], w["w_down"])
            if profile == "bf16":
                GM.routing(logits, k, True)
                GM.routing(logits, k, False)
                GM.shared_expert(h, w["w_shared_gate"], w["w_shared_up"], w["w_shared_down"],
                                w["w_shared_expert_gate"])
                GM.combine(torch.zeros(N * k, D), torch.zeros(N, D, dtype=h.dtype), torch.zeros(N, dtype=h.dtype),
                          N, D, k, h.dtype, h.device)
        names |= {kernel for kernel, _ in done.builds}
        assert not done.problems(), done.problems()
    assert names == {"routing_kernel", "expert_gate_up_kernel", "expert_down_kernel", "shared_swiglu_kernel",
                     "combine_kernel"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU run compiles every kernel for real")
@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
def test_sparse_decode_compiles_without_spills():
    """The compile check's sparse decode steps (E = 512, top 10, D = 2048; B = 1 and 64, every
    profile), built for sm_90: no problem, and no kernel of the decode path spills."""
    compiler = run_plan([step for step in moe_plan() if step[1]])
    assert compiler.problems() == []
    decode = [b for b in compiler.builds.values() if b.decode]
    assert {"routing_kernel", "expert_gate_up_kernel", "expert_down_kernel", "combine_kernel",
            "shared_swiglu_kernel"} <= {b.kernel for b in decode}
    assert all(b.local_bytes == 0 for b in decode), [(b.kernel, b.params, b.local_bytes) for b in decode]
