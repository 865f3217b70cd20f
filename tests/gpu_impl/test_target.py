"""Target selection: the device choice, independence from import order and ``TRITON_INTERPRET``,
the compile check (every kernel built for sm_90 as the JIT builds it, without a GPU), and (on a
GPU) compiled = interpreted."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import triton.language as tl

import gdncheck.gpu_impl as G
from gdncheck.gpu_impl import Layer, resolve_device
from gdncheck.gpu_impl.compile_check import (
    PREFILL_SPILLS,
    SM90,
    Build,
    compile_only,
    ctas_per_sm,
    main,
    markdown,
    only,
    plan,
    run_plan,
    scenario,
    spill_allowance,
    table,
)
from gdncheck.gpu_impl.target import kernel
from gdncheck.synthetic import make_inputs, make_weights
from tests.gpu_impl.compare import check
from tests.gpu_impl.helpers import DEVICE, needs_interpreter
from tests.helpers import tiny_config

CFG = tiny_config(Hk=2, Hv=4, dk=16, dv=8, D=32, I=48)


def test_device_choice(monkeypatch):
    monkeypatch.setenv("GDN_DEVICE", "cpu")
    assert resolve_device() == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setenv("GDN_DEVICE", "tpu")
    with pytest.raises(ValueError, match="GDN_DEVICE must be one of auto, cpu, cuda, found 'tpu'"):
        resolve_device()
    monkeypatch.delenv("GDN_DEVICE")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device().type == expected
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            resolve_device("cuda")


SCRIPT = """
import numpy as np, torch
{first}
import gdncheck.reference as R
from gdncheck.gpu_impl import delta_rule_chunked, resolve_device
rng = np.random.default_rng(0)
q = rng.normal(size=(1, 20, 1, 16)); q /= np.sqrt((q * q).sum(-1, keepdims=True))
v = rng.normal(size=(1, 20, 2, 16)); g = -rng.uniform(0, 1, size=(1, 20, 2)); b = rng.uniform(0, 1, size=(1, 20, 2))
t = lambda a: torch.tensor(a, dtype=torch.float32)
core, S = delta_rule_chunked(t(q), t(q), t(v), t(g), t(b), chunk_size=16)
ref, _ = R.delta_rule_recurrent(q, q, v, g, b)
print("device", resolve_device(), "err", float(np.abs(core.numpy() - ref).max()))
"""


@needs_interpreter
@pytest.mark.parametrize(
    "first, env",
    [
        ("import triton", {}),  # triton imported before us, without TRITON_INTERPRET
        ("import os; os.environ['TRITON_INTERPRET'] = '1'; import triton", {}),  # set after import of os only
        ("import triton", {"TRITON_INTERPRET": "1"}),  # set before triton is imported
    ],
    ids=["triton-first", "set-in-process", "set-in-environment"],
)
def test_cpu_target_does_not_depend_on_import_order(first, env, tmp_path):
    """The kernels use tl.sum, tl.cumsum and tl.zeros, which Triton decorates at its import."""
    full_env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    full_env.update({"GDN_DEVICE": "cpu", **env})
    run = subprocess.run([sys.executable, "-c", SCRIPT.format(first=first)], capture_output=True, text=True,
                         env=full_env, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    words = run.stdout.split()
    assert words[1] == "cpu" and float(words[3]) < 1e-5, run.stdout


def test_cuda_refused_when_triton_was_imported_interpreted(tmp_path):
    code = textwrap.dedent("""
        import os; os.environ["TRITON_INTERPRET"] = "1"
        import triton
        from gdncheck.gpu_impl.target import interpreter_forced, resolve_device
        assert interpreter_forced()
        assert resolve_device("auto").type == "cpu"
        try:
            resolve_device("cuda")
        except ValueError as e:
            print("refused:", e)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "refused:" in run.stdout


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


@pytest.mark.gpu
@needs_interpreter
@pytest.mark.parametrize("profile", ["f32", "bf16"])
def test_compiled_matches_interpreted(profile):
    """One process, both targets: the CUDA build and the interpreter on the same inputs."""
    w = make_weights(CFG, seed=1)
    x = make_inputs(CFG, 2, 70, seed=2)
    outs = {}
    for device in ("cuda", "cpu"):
        layer = Layer(CFG, w, profile=profile, device=device, chunk_size=16)
        state = layer.new_state(2)
        a, _ = layer.forward(x[:, :69], state, 0)
        b, _ = layer.forward(x[:, 69:], state, 69)
        outs[device] = (torch.cat([a, b], 1).cpu(), state.recurrent_state.cpu())
    check(outs["cuda"][0], outs["cpu"][0], "forms", profile, "out, compiled vs interpreted")
    check(outs["cuda"][1], outs["cpu"][1], "forms", profile, "state, compiled vs interpreted")
    assert DEVICE.type == "cuda"


@needs_interpreter
def test_heads_per_program_is_one_rule_for_every_kernel(monkeypatch):
    """target.heads_per_program, which the conv and the recurrent delta rule share: a requested count
    must be a power of two (the message names the kernel); interpreted, every head up to the lane
    budget, as a power of two; a tensor that is not interpreted gets one head per program."""
    from gdncheck.gpu_impl.target import heads_per_program, interpreting

    t = torch.zeros(1, device=DEVICE)
    assert interpreting(t)
    assert heads_per_program(t, "k", 6, 16, 8192) == 8  # 6 heads -> next power of two
    assert heads_per_program(t, "k", 48, 128 * 128, 65536) == 4  # the lane budget caps it
    assert heads_per_program(t, "k", 48, 128 * 128, 100) == 1  # never below one
    assert heads_per_program(t, "k", 48, 16, 8192, asked=2) == 2
    with pytest.raises(ValueError, match=r"^my_kernel: heads_per_program must be a power of two, found 3$"):
        heads_per_program(t, "my_kernel", 48, 16, 8192, asked=3)
    import gdncheck.gpu_impl.target as target

    monkeypatch.setattr(target, "interpreting", lambda _t: False)  # as for a compiled (CUDA) tensor
    assert heads_per_program(t, "k", 48, 16, 8192) == 1
