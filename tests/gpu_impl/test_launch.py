"""The interpreted launch (gpu_impl/interpreter.py ``run_grid``): the same results, bit for bit, as
Triton's own ``GridExecutor`` on the package's kernels (a multi-program grid, defaults, constexprs, an
in-place update, the emulated program orders), an error surfaces as the interpreter's, and nothing
it caches or patches outlives a launch."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter as ti

from gdncheck.gpu_impl import interpreter
from gdncheck.gpu_impl.gates import gates_kernel
from gdncheck.gpu_impl.target import kernel
from tests.gpu_impl.helpers import needs_interpreter


@kernel
def _scan_kernel(p_x, p_out, n, SCALE: tl.constexpr, BLOCK: tl.constexpr, OFFSET=0):
    """out[i] = x[i] * SCALE + OFFSET + program id, then x[i] += 1 (in place); grid (cdiv(n, BLOCK),)."""
    i = tl.program_id(0)
    o = i * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    x = tl.load(p_x + o, mask=m, other=0.0)
    tl.store(p_out + o, x * SCALE + OFFSET + i.to(tl.float32), mask=m)
    tl.store(p_x + o, x + 1.0, mask=m)


def _gates_args(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(37, 6, generator=g), torch.randn(37, 6, generator=g) * 30
    return dict(p_a=a, p_b=b, p_alog=torch.randn(6, generator=g), p_dt=torch.randn(6, generator=g),
                p_g=torch.full_like(a, float("nan")), p_beta=torch.full_like(a, float("nan")), n_rows=37, H=6,
                stride_a=6, stride_b=6, BR=8, BH=8)


def _both(k, grid, make):
    """(run_grid's tensors, GridExecutor's tensors) of one launch on fresh arguments from ``make``."""
    mine, theirs = make(), make()
    k[grid](**mine)  # Kernel._launch -> run_grid
    with interpreter.interpreting():
        k.interpreted[grid](**theirs)
    return mine, theirs


@needs_interpreter
@pytest.mark.parametrize("order", ["grid", "reverse", "shuffle"])
def test_run_grid_equals_grid_executor(order):
    def scan_args():
        return dict(p_x=torch.arange(50, dtype=torch.float32) / 7, p_out=torch.full((50,), float("nan")), n=50,
                    SCALE=3, BLOCK=16)

    with interpreter.emulate_gpu(tf32=False, order=order, seed="launch"):
        cases = [(_scan_kernel, (4,), scan_args), (gates_kernel, (5,), lambda: _gates_args(1))]
        for k, grid, make in cases:
            mine, theirs = _both(k, grid, make)
            for name, t in mine.items():
                if isinstance(t, torch.Tensor):
                    assert t.dtype == theirs[name].dtype
                    assert t.view(torch.int32).equal(theirs[name].view(torch.int32)), (k.__name__, name)
    # the independent check: the scan's numbers, the default OFFSET (0) and the in-place update
    mine, _ = _both(_scan_kernel, (4,), scan_args)
    x0 = torch.arange(50, dtype=torch.float32) / 7
    assert torch.equal(mine["p_out"], x0 * 3 + torch.arange(50).div(16, rounding_mode="floor").float())
    assert torch.equal(mine["p_x"], x0 + 1)


@kernel
def _bad_kernel(p_x, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(p_x + o, tl.load(p_x + o) + tl.zeros([BLOCK * 2], dtype=tl.float32))  # shapes do not broadcast


@needs_interpreter
def test_run_grid_error_is_the_interpreters():
    with pytest.raises(triton.runtime.errors.InterpreterError, match="incompatible|broadcast|shape"):
        _bad_kernel[(1,)](p_x=torch.zeros(4), BLOCK=4)


@needs_interpreter
def test_launch_leaves_the_interpreter_as_it_was():
    def now():
        return (ti._patch_builtin, ti._get_np_dtype, tl.tensor.__add__, tl.core.add, tl.load, tl.block_type.__init__,
                tl.tensor.__init__, dict(vars(ti.interpreter_semantic)))

    before = now()
    _scan_kernel[(2,)](p_x=torch.zeros(20), p_out=torch.zeros(20), n=20, SCALE=1, BLOCK=16)
    with pytest.raises(triton.runtime.errors.InterpreterError):
        _bad_kernel[(1,)](p_x=torch.zeros(4), BLOCK=4)
    assert now() == before
    assert interpreter._DEPTH == 0
