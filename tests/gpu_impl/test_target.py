"""Target selection: the device choice, independence from import order and ``TRITON_INTERPRET``, one
heads-per-program rule, and (on a GPU) compiled = interpreted. The compile check, which builds every
kernel for sm_90 without a GPU: tests/gpu_tools/test_compile_check.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from gdncheck.gpu_impl import Layer, resolve_device
from gdncheck.synthetic import make_inputs, make_weights
from tests.gpu_impl.compare import check
from tests.gpu_impl.helpers import DEVICE, needs_interpreter
from tests.helpers import tiny_config

CFG = tiny_config(Hk=2, Hv=4, dk=16, dv=8, D=32, I=48)


def test_device_choice(monkeypatch):
    monkeypatch.setenv("GDN_DEVICE", "cpu")
    assert resolve_device() == torch.device("cpu")
    # an explicit "auto" overrides GDN_DEVICE: a GPU where torch sees one
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    if torch.cuda.is_available():  # a CUDA tensor's device (cuda:0) compares equal with what it resolves to
        assert resolve_device("cuda:0") == resolve_device("cuda") == torch.zeros(1, device="cuda").device
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
