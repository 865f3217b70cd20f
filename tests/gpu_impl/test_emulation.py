"""The interpreter's emulation of compiled sm_90 code (gpu_impl/interpreter.py) and the launch
contract (every argument by name): each emulation shown to do what a GPU does, on values chosen
so that the exact interpreter would give another answer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton.language as tl

from gdncheck.gpu_impl.interpreter import emulate_gpu, tf32_round, tf32_truncate
from gdncheck.gpu_impl.target import kernel


@kernel
def _dot_kernel(p_a, p_b, p_c, PREC: tl.constexpr):
    o = tl.arange(0, 16)
    a = tl.load(p_a + o[:, None] * 16 + o[None, :])
    b = tl.load(p_b + o[:, None] * 16 + o[None, :])
    tl.store(p_c + o[:, None] * 16 + o[None, :], tl.dot(a, b, input_precision=PREC))


def _dot(a, b, prec, **emulation):
    c = torch.empty(16, 16)
    with emulate_gpu(**emulation):
        _dot_kernel[(1,)](p_a=a, p_b=b, p_c=c, PREC=prec)
    return c.double().numpy()


def test_tf32_bit_helpers():
    x = np.array([1 + 2**-10 + 2**-11, 1 + 2**-11, 1 + 2**-12, -(1 + 2**-11)], dtype=np.float32)
    # truncation keeps 10 mantissa bits; rna rounds to nearest, ties away from zero
    assert tf32_truncate(x).tolist() == [1 + 2**-10, 1.0, 1.0, -1.0]
    assert tf32_round(x).tolist() == [1 + 2**-9, 1 + 2**-10, 1.0, -(1 + 2**-10)]


def test_tl_dot_tf32_truncates_operands_as_sm90_does():
    rng = np.random.default_rng(0)
    a64, b64 = rng.normal(size=(16, 16)), rng.normal(size=(16, 16))
    a, b = torch.tensor(a64, dtype=torch.float32), torch.tensor(b64, dtype=torch.float32)
    exact = a.double().numpy() @ b.double().numpy()
    want = tf32_truncate(a.numpy()).astype(np.float64) @ tf32_truncate(b.numpy()).astype(np.float64)
    got = _dot(a, b, "tf32", tf32=True, order="grid")
    assert np.abs(got - want).max() < 1e-5 * np.abs(want).max()  # fp32 sums of the truncated products
    assert np.abs(got - exact).max() > 1e-4 * np.abs(exact).max()  # ~2^-10: visibly not the exact product
    # without the emulation the interpreter multiplies exact fp32 operands
    assert np.abs(_dot(a, b, "tf32", tf32=False, order="grid") - exact).max() < 1e-5 * np.abs(exact).max()
    # tf32x3 recovers about fp32 accuracy; ieee is exact fp32
    assert np.abs(_dot(a, b, "tf32x3", tf32=True, order="grid") - exact).max() < 1e-5 * np.abs(exact).max()
    assert np.abs(_dot(a, b, "ieee", tf32=True, order="grid") - exact).max() < 1e-5 * np.abs(exact).max()


@kernel
def _chain_kernel(p_x, N: tl.constexpr):
    """Program i writes x[i + 1] = x[i] + 1: correct only if programs run in grid order (a race)."""
    i = tl.program_id(0)
    tl.store(p_x + i + 1, tl.load(p_x + i) + 1.0)


@pytest.mark.parametrize("order", ["reverse", "shuffle"])
def test_program_order_exposes_an_inter_program_dependency(order):
    in_order = torch.zeros(9)
    with emulate_gpu(tf32=False, order="grid"):
        _chain_kernel[(8,)](p_x=in_order, N=8)
    assert in_order.tolist() == list(range(9))
    permuted = torch.zeros(9)
    with emulate_gpu(tf32=False, order=order, seed=3):
        _chain_kernel[(8,)](p_x=permuted, N=8)
    assert permuted.tolist() != list(range(9)), "every program ran, but in grid order"
    assert permuted[1:].min() >= 1  # every program still ran once


@kernel
def _grid_ids(p_out, NY: tl.constexpr, NZ: tl.constexpr):
    x, y, z = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    tl.store(p_out + (x * NY + y) * NZ + z, x * 100 + y * 10 + z)


def test_permuted_order_still_runs_each_program_once_with_its_own_ids():
    out = torch.full((24,), -1, dtype=torch.int32)
    with emulate_gpu(order="shuffle", seed="ids"):
        _grid_ids[(2, 3, 4)](p_out=out, NY=3, NZ=4)
    want = [x * 100 + y * 10 + z for x in range(2) for y in range(3) for z in range(4)]
    assert out.tolist() == want


def test_emulation_arguments_are_checked():
    with pytest.raises(ValueError, match="order must be one of grid, reverse, shuffle"):
        with emulate_gpu(order="random"):
            pass


# --- the launch contract -------------------------------------------------------------------------


def test_launches_name_every_argument():
    x = torch.zeros(9)
    with pytest.raises(TypeError, match="launch with keyword arguments"):
        _chain_kernel[(8,)](x, N=8)
    with pytest.raises(TypeError, match=r"missing \['N'\], unknown none"):
        _chain_kernel[(8,)](p_x=x)
    # the interpreter would silently drop an unknown keyword, e.g. a misspelled stride
    with pytest.raises(TypeError, match=r"missing none, unknown \['stride_xt'\]"):
        _chain_kernel[(8,)](p_x=x, N=8, stride_xt=1)


def test_grid_limits_are_refused_before_launch():
    x = torch.zeros(9)
    with pytest.raises(ValueError, match="outside CUDA's limits"):
        _chain_kernel[(1, 65536)](p_x=x, N=8)
    with pytest.raises(ValueError, match="outside CUDA's limits"):
        _chain_kernel[(0,)](p_x=x, N=8)


def test_every_package_launch_is_by_name():
    """A swapped stride must be an error: no launch in gpu_impl passes an argument by position."""
    import ast
    from pathlib import Path

    import gdncheck.gpu_impl as G

    for path in Path(G.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript) and node.func.value.__class__ \
                    is ast.Name and node.func.value.id.endswith("_kernel"):
                assert not node.args, f"{path.name}:{node.lineno}: {node.func.value.id} launched by position"
