"""Low-precision arithmetic for the precision-emulating layer (`.emulate`).

Arrays are float32 NumPy arrays throughout; a value "stored in the profile dtype" is a float32
holding a bf16 or f16 number (`store`). The gated delta rule is here in the two forms engines use,
with hooks where an engine stores an intermediate (docs/math.md §4); the formulas are those of
`gdncheck.reference`. Every sum of products and every reduction is accumulated in float32 in one
of `ORDERS` (`blas`, `sequential`, `blocked16`); nothing is accumulated in float64.

The orders, what each stands for and why they matter: docs/tolerances.md §2.1.
"""

from __future__ import annotations

import numpy as np

from gdncheck.dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from gdncheck.profiles import VERIFY_PROFILES, choices

F32 = np.float32
#: Summation orders (module docstring); ``blas`` is the default everywhere.
ORDERS = ("blas", "sequential", "blocked16")


def f32(x) -> np.ndarray:
    return np.asarray(x, dtype=F32)


def store(x, profile: str) -> np.ndarray:
    """Round float32 ``x`` to the profile's dtype (round to nearest even); float32 result."""
    x = f32(x)
    if profile == "f32":
        return x
    if profile == "bf16":
        return bf16_bits_to_f32(f32_to_bf16_bits(x))
    if profile == "f16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(F32)
    raise ValueError(f"unknown precision profile {profile!r}; expected {choices(VERIFY_PROFILES)}")


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return F32(1.0) / (F32(1.0) + np.exp(-x))


def silu(x: np.ndarray) -> np.ndarray:
    return x * sigmoid(x)


def softplus(x: np.ndarray, threshold: float | None = None) -> np.ndarray:
    """log(1 + e^x) in float32; with ``threshold`` (torch: 20) x itself above it."""
    sp = np.logaddexp(F32(0.0), x)
    return sp if threshold is None else np.where(x > threshold, x, sp)


def block_of(order: str) -> int:
    """The number of terms summed before they meet the running accumulator (0: ``blas``)."""
    if order == "blas":
        return 0
    if order == "sequential":
        return 1
    if order.startswith("blocked") and order[7:].isdigit() and int(order[7:]) > 1:
        return int(order[7:])
    raise ValueError(f"summation order must be blas, sequential or blocked<N> (N > 1), found {order!r}")


def sum_last(x: np.ndarray, order: str = "blas") -> np.ndarray:
    """Sum over the last axis in float32, in ``order`` (keeps the axis, length 1)."""
    x = f32(x)
    bs = block_of(order)
    if bs == 0:
        return np.sum(x, axis=-1, keepdims=True, dtype=F32)
    if bs > 1:  # each block summed on its own (zeros pad the last one: adding 0 is exact), then in order
        n = x.shape[-1]
        pad = -n % bs
        x = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)]).reshape(*x.shape[:-1], (n + pad) // bs, bs)
        x = np.sum(x, axis=-1, dtype=F32)
    return np.add.accumulate(x, axis=-1, dtype=F32)[..., -1:]


def contract(a: np.ndarray, b: np.ndarray, order: str = "blas") -> np.ndarray:
    """a [..., M, K] @ b [..., K, N] (leading axes broadcast) with float32 products summed in float32
    in ``order``: ``sequential`` is acc += a[..., :, k] * b[..., k, :] for k in order, one product
    and one sum rounded each, vectorised over every output; ``blocked<N>`` adds the BLAS product of
    each block of N consecutive k to the accumulator, block after block."""
    a, b = f32(a), f32(b)
    bs = block_of(order)
    if bs == 0:
        return np.matmul(a, b)
    K = a.shape[-1]
    if bs > 1:
        acc = np.matmul(a[..., :bs], b[..., :bs, :])
        for k0 in range(bs, K, bs):
            acc += np.matmul(a[..., k0:k0 + bs], b[..., k0:k0 + bs, :])
        return acc
    shape = np.broadcast_shapes(a.shape[:-1] + (1,), b.shape[:-2] + (1, b.shape[-1]))
    acc, prod = np.zeros(shape, dtype=F32), np.empty(shape, dtype=F32)
    ak = np.ascontiguousarray(np.moveaxis(a, -1, 0))[..., None]  # [K, ..., M, 1]
    bk = np.ascontiguousarray(np.moveaxis(b, -2, 0))[..., None, :]  # [K, ..., 1, N]
    for k in range(K):
        np.multiply(ak[k], bk[k], out=prod)
        np.add(acc, prod, out=acc)
    return acc


def rms_normalize(x: np.ndarray, eps: float, order: str = "blas") -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) over the last axis, in float32."""
    if order == "blas":
        var = np.mean(x * x, axis=-1, keepdims=True, dtype=F32)
    else:
        var = sum_last(x * x, order) / F32(x.shape[-1])
    return x * (F32(1.0) / np.sqrt(var + F32(eps)))


def l2_normalize(x: np.ndarray, eps: float = 1e-6, order: str = "blas") -> np.ndarray:
    return x * (F32(1.0) / np.sqrt(sum_last(x * x, order) + F32(eps)))


def matmul_t(x: np.ndarray, w: np.ndarray, order: str = "blas") -> np.ndarray:
    """x @ w.T with float32 operands, accumulated in float32 in ``order``."""
    x, w = f32(x), f32(w)
    if order == "blas":
        return np.matmul(x, w.T)
    return contract(x.reshape(-1, x.shape[-1]), w.T, order).reshape(*x.shape[:-1], w.shape[0])


def expand_heads(x: np.ndarray, num_v_heads: int) -> np.ndarray:
    """[..., Hk, d] -> [..., Hv, d] by repeat_interleave (value head j reads key head j // r)."""
    return np.repeat(x, num_v_heads // x.shape[-2], axis=-2)


def _read(vec: np.ndarray, S: np.ndarray, order: str) -> np.ndarray:
    """vec [..., dk] . S [..., dk, dv] -> [..., dv] (the delta rule's k.S and q.S)."""
    if order == "blas":
        return np.einsum("bhk,bhkv->bhv", vec, S)
    return contract(vec[..., None, :], S, order)[..., 0, :]


def delta_rule_recurrent_f32(q, k, v, g, beta, state, scale, *, scale_at="q", state_store=None, order="blas"):
    """Token-by-token gated delta rule in float32 (reference: ``delta_rule_recurrent``).

    q, k: [B, T, Hv, dk] (already expanded); v: [B, T, Hv, dv]; g, beta: [B, T, Hv]; state
    [B, Hv, dk, dv] float32. ``scale_at="q"`` folds the scale into q (HF, FLA), ``"out"`` multiplies
    the output (metrale). ``state_store`` rounds the state after every token (a bf16 state).
    ``order`` sums the reads k.S and q.S over dk. Returns core [B, T, Hv, dv] and the new state.
    """
    S = f32(state).copy()
    T = v.shape[1]
    qs = q * F32(scale) if scale_at == "q" else q
    core = np.empty(v.shape, dtype=F32)
    decay = np.exp(g)
    for t in range(T):
        S *= decay[:, t, :, None, None]
        m = _read(k[:, t], S, order)
        delta = beta[:, t, :, None] * (v[:, t] - m)
        S += k[:, t, :, :, None] * delta[:, :, None, :]
        if state_store is not None:
            S = state_store(S)
        o = _read(qs[:, t], S, order)
        core[:, t] = o * F32(scale) if scale_at == "out" else o
    return core, S


def _unit_lower_inverse_f32(A: np.ndarray, order: str = "blas") -> np.ndarray:
    """(I + A)^-1 for strictly lower-triangular A [..., C, C], by forward substitution in float32."""
    C = A.shape[-1]
    inv = np.zeros_like(A)
    idx = np.arange(C)
    inv[..., idx, idx] = 1.0
    for i in range(1, C):
        if order == "blas":
            inv[..., i, :i] = -np.einsum("...j,...jc->...c", A[..., i, :i], inv[..., :i, :i])
        else:
            inv[..., i, :i] = -contract(A[..., i:i + 1, :i], inv[..., :i, :i], order)[..., 0, :]
    return inv


def delta_rule_chunked_f32(q, k, v, g, beta, state, scale, *, chunk_size=64, lowp=None, scale_at="out",
                           order="blas", quotient_of_exps=False, mask_by_product=False):
    """The chunked (WY/UT) gated delta rule in float32 (reference: ``delta_rule_chunked``).

    Decay factors come from differences of chunk-local cumulative sums of g, as HF and FLA compute
    them. ``lowp``, when given, rounds to the activation dtype where FLA's chunk kernels store it:
    the inverse (I+A)^-1, w and u, the state operand of w@h and q@h, the decayed v_new, the masked
    q k^T block, and q, k themselves. Without it every intermediate stays float32 (HF's fallback).
    ``scale_at="q"`` folds the scale into q first (HF), ``"out"`` scales the output (FLA).
    ``order`` sums every product in the chunk (over dk or over the chunk's positions) and the forward
    substitution. ``quotient_of_exps`` computes the decay between positions i and j as
    ``exp(γ_i) / exp(γ_j)`` instead of ``exp(γ_i - γ_j)`` (a bug class of the mutants: 0/0 where a
    chunk's cumulative decay underflows). ``mask_by_product`` takes exp(γ_i − γ_j) over the whole
    chunk and masks it by multiplying with the causal mask (another bug class: inf · 0 = NaN where the
    masked half's exp overflows, a chunk decaying by more than e^88). Shapes as
    :func:`delta_rule_recurrent_f32`.
    """
    if scale_at == "q":
        q, scale = q * F32(scale), 1.0
    r = lowp if lowp is not None else (lambda a: a)
    B, T, Hv, dv = v.shape
    C = min(chunk_size, T)  # a call shorter than a chunk is one (unpadded) chunk
    N = -(-T // C)
    pad = N * C - T

    def chunks(x):  # [B, T, Hv, ...] -> [B, Hv, N, C, ...]
        x = np.moveaxis(x, 2, 1)
        x = np.pad(x, [(0, 0), (0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 3))
        return x.reshape(B, Hv, N, C, *x.shape[3:])

    Q, K, V, G, Bt = chunks(r(q)), chunks(r(k)), chunks(v), chunks(g), chunks(beta)
    S = f32(state).copy()
    out = np.empty((B, Hv, N, C, dv), dtype=F32)
    lower = np.tri(C, C, 0, dtype=bool)
    strict = np.tri(C, C, -1, dtype=bool)

    def mm(x, y):
        return contract(x, y, order)

    for n in range(N):
        Qn, Kn, Vn, gn, bn = Q[:, :, n], K[:, :, n], V[:, :, n], G[:, :, n], Bt[:, :, n]
        KnT = np.swapaxes(Kn, -1, -2)
        gamma = np.cumsum(gn, axis=-1, dtype=F32)
        diff = gamma[..., :, None] - gamma[..., None, :]
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            if quotient_of_exps:
                eg = np.exp(gamma)
                E = np.where(lower, eg[..., :, None] / eg[..., None, :], F32(0.0))
            elif mask_by_product:
                E = np.exp(diff) * lower.astype(F32)
            else:
                E = np.where(lower, np.exp(np.where(lower, diff, F32(0.0))), F32(0.0))
        if mask_by_product:
            A = bn[..., :, None] * mm(Kn, KnT) * E * strict.astype(F32)
        else:
            A = np.where(strict, bn[..., :, None] * mm(Kn, KnT) * E, F32(0.0))
        Tinv = r(_unit_lower_inverse_f32(A, order))
        W = r(mm(Tinv, r(Kn * (bn * np.exp(gamma))[..., None])))
        U = r(mm(Tinv, r(Vn * bn[..., None])))
        Vp = U - mm(W, r(S))
        QK = r(mm(Qn, KnT) * E if mask_by_product else np.where(lower, mm(Qn, KnT) * E, F32(0.0)))
        out[:, :, n] = F32(scale) * (mm(Qn * np.exp(gamma)[..., None], r(S)) + mm(QK, r(Vp)))
        last = gamma[..., -1:]
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            tail = np.exp(last) / np.exp(gamma) if quotient_of_exps else np.exp(last - gamma)
        Vd = r(Vp * tail[..., None])
        S = S * np.exp(last)[..., None] + mm(KnT, Vd)
    core = np.moveaxis(out.reshape(B, Hv, N * C, dv)[:, :, :T], 1, 2)
    return np.ascontiguousarray(core), S
