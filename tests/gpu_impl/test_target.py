"""Target selection: the device choice, independence from import order and ``TRITON_INTERPRET``,
every kernel compiling for sm_90 (H200) without a GPU, and (on a GPU) compiled = interpreted."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import gdncheck.gpu_impl as G
from gdncheck.gpu_impl import Layer, resolve_device
from gdncheck.gpu_impl.target import compile_only
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


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU run compiles every kernel for real")
@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
def test_every_kernel_compiles_for_sm90():
    """The launches a GPU would make (GPU block sizes, dot precisions, flags), built for
    cuda:sm_90 with Triton's bundled ptxas; nothing runs. Chunk 64 in bf16 (the production
    prefill), chunk 16 for f32 and f16 (64 builds too on the GPU runner, ~16 s each here)."""
    names = set()
    for profile, chunk in (("bf16", 64), ("f32", 16), ("f16", 16)):
        layer = Layer(CFG, make_weights(CFG), profile=profile, device="cpu", chunk_size=chunk)
        x = make_inputs(CFG, 2, 40, seed=0)
        with compile_only() as done:
            state = layer.new_state(2)
            layer.forward(x, state, 0, capture=True)  # chunked prefill, fused conv with capture
            layer.forward(x[:, :1], state, 40)  # decode: in-place conv and recurrent updates
            qkv = torch.zeros(2, 3, CFG.conv_dim, dtype=layer.dtype)
            G.conv1d(qkv, state.conv_state, layer.w_conv)
            G.conv1d_update(qkv[:, :1], state.conv_state, layer.w_conv)
            G.qk_norm(qkv, CFG.num_k_heads, CFG.head_k_dim, CFG.num_v_heads, CFG.head_v_dim)
            G.post_norm(qkv, torch.zeros(CFG.conv_dim), 1e-6)
        names |= {name for name, _ in done}
    assert names == {
        "rms_norm_kernel", "conv1d_qk_norm_kernel", "gates_kernel", "chunk_wu_kernel", "chunk_state_kernel",
        "delta_rule_recurrent_kernel", "gated_norm_kernel", "residual_post_norm_kernel", "swiglu_kernel",
        "conv1d_kernel", "l2_norm_heads_kernel",
    }


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
