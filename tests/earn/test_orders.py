"""Summation orders of the emulated layer (conformance/earn/lowp.py): each order is the float32
arithmetic it claims, checked against scalar float32 loops and Higham's error bound, and the
derivation runs every placement with every order."""

from __future__ import annotations

import numpy as np
import pytest

from gdncheck.conformance.earn import derive, lowp
from gdncheck.conformance.earn.emulate import PLACEMENTS, EmulatedLayer, placement_of
from gdncheck.fixtures.recipes import cfg_of
from gdncheck.synthetic import make_inputs, make_weights

F32 = np.float32


def _running_dot(x, y):
    """One float32 accumulator, product rounded, then sum rounded: the scalar loop a naive kernel runs."""
    acc = F32(0)
    for a, b in zip(x, y):
        acc = F32(acc + F32(F32(a) * F32(b)))
    return acc


def test_sequential_contract_is_a_scalar_float32_loop():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 3, 4, 37)).astype(F32)
    b = rng.standard_normal((1, 3, 37, 5)).astype(F32)  # leading axes broadcast
    got = lowp.contract(a, b, "sequential")
    assert got.dtype == F32 and got.shape == (2, 3, 4, 5)
    for i, j, m, n in np.ndindex(got.shape):
        assert got[i, j, m, n] == _running_dot(a[i, j, m], b[0, j, :, n]), (i, j, m, n)


def test_blocked_contract_adds_one_block_product_at_a_time():
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((6, 70)).astype(F32), rng.standard_normal((70, 3)).astype(F32)
    want = np.matmul(a[:, :16], b[:16])
    for k0 in (16, 32, 48, 64):  # 70 = 4 x 16 + 6: the last block is short
        want = want + np.matmul(a[:, k0:k0 + 16], b[k0:k0 + 16])
    assert np.array_equal(lowp.contract(a, b, "blocked16"), want)


def test_sequential_sum_is_a_running_float32_sum():
    x = np.random.default_rng(5).standard_normal((3, 1000)).astype(F32)
    for row, got in zip(x, lowp.sum_last(x, "sequential")[:, 0]):
        acc = F32(0)
        for v in row:
            acc = F32(acc + v)
        assert got == acc
    for row, got in zip(x, lowp.sum_last(x, "blocked16")[:, 0]):
        acc = F32(0)
        for k0 in range(0, 1000, 16):
            acc = F32(acc + np.sum(row[k0:k0 + 16], dtype=F32))
        assert got == acc  # 1000 = 62 x 16 + 8: the zeros padding the last block add nothing


def test_orders_differ_within_the_float32_error_bound():
    """|fl(x.y) - x.y| <= gamma_K sum |x_i y_i| (Higham, Accuracy and Stability, 3.1) for every order;
    the orders give different float32 numbers; the sequential sum of many like terms is the worst."""
    rng = np.random.default_rng(6)
    K = 4096
    a, b = rng.standard_normal((8, K)).astype(F32), rng.standard_normal((K, 16)).astype(F32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    u = 2.0 ** -24
    bound = K * u / (1 - K * u) * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64))
    got = {o: lowp.contract(a, b, o) for o in lowp.ORDERS}
    for order, value in got.items():
        assert np.all(np.abs(value - exact) <= bound), order
    assert not np.array_equal(got["blas"], got["sequential"]) and not np.array_equal(got["blas"], got["blocked16"])
    x = np.full((1, 200_000), 0.1, dtype=F32)  # a running sum of equal terms drifts; pairwise does not
    err = {o: abs(float(lowp.sum_last(x, o)[0, 0]) - 200_000 * float(F32(0.1))) for o in lowp.ORDERS}
    assert err["sequential"] > 100 * err["blas"] and err["sequential"] > 10 * err["blocked16"]


def test_placement_specs_name_an_order():
    assert placement_of("hf") is PLACEMENTS["hf"] and PLACEMENTS["hf"].order == "blas"
    p = placement_of("fla:sequential")
    assert (p.name, p.order, p.fla_chunk) == ("fla:sequential", "sequential", True)
    assert placement_of("metrale:blocked64").order == "blocked64"
    for bad in ("tvm", "hf:pairwise", "hf:blocked1", "hf:blocked"):
        with pytest.raises(ValueError, match="placement"):
            placement_of(bad)


def test_the_emulated_layer_sums_in_its_order():
    """f32, D = 256: x_norm's mean of squares and qkv's dot products are the scalar running sums."""
    cfg = cfg_of(D=256, I=32, Hk=1, Hv=2, dk=8, dv=8)
    weights = make_weights(cfg, 7)
    x = make_inputs(cfg, 1, 2, 7).astype(F32)
    layer = EmulatedLayer(cfg, weights, profile="f32", placement="hf:sequential")
    _, trace = layer.forward(x, layer.new_state(1), 0)
    w_in = F32(1) + np.asarray(weights["input_layernorm.weight"], dtype=F32)
    w_qkv = np.asarray(weights["linear_attn.in_proj_qkv.weight"], dtype=F32)
    for t in range(2):
        row = x[0, t]
        ss = F32(0)
        for v in row:
            ss = F32(ss + F32(v * v))
        inv = F32(1) / np.sqrt(F32(ss / F32(256)) + F32(cfg.rms_norm_eps))
        x_norm = (row * inv) * w_in
        assert np.array_equal(trace["x_norm"][0, t], x_norm)
        assert all(trace["qkv"][0, t, n] == _running_dot(x_norm, w_qkv[n]) for n in range(0, w_qkv.shape[0], 7))
    _, blas = EmulatedLayer(cfg, weights, profile="f32", placement="hf").forward(x, layer.new_state(1), 0)
    assert not np.array_equal(blas["x_norm"], trace["x_norm"])


def test_the_derivation_runs_every_placement_with_every_order():
    small = derive.variants("bf16", ("prefill",))
    assert set(small) == {p if o == "blas" else f"{p}:{o}" for p in ("hf", "fla", "fp32_once") for o in lowp.ORDERS}
    assert "hf:sequential" in derive.variants("f32", ("full", "real-sizes"))
    assert "hf:sequential" not in derive.variants("bf16", ("full", "real-sizes"))
    assert "fla:blocked16" in derive.variants("f16", ("full", "real-sizes"))
