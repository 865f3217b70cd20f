"""Low-precision arithmetic for the precision-emulating layer (:mod:`.emulate`).

Arrays are float32 NumPy arrays throughout: float32 arithmetic is float32 arithmetic, and a value
"stored in the profile dtype" is a float32 holding a bf16 or f16 number (:func:`store`). Matrix
products go through float32 BLAS, so they accumulate in float32 like a GPU GEMM with fp32
accumulators. The gated delta rule is here in the two forms engines use, each with hooks where an
engine stores an intermediate in the activation dtype (gdn-spec §6). The formulas are those of
``gdncheck.reference`` (their docstrings hold the math); only the arithmetic differs.
"""

from __future__ import annotations

import numpy as np

from gdncheck.dtypes import bf16_bits_to_f32, f32_to_bf16_bits

F32 = np.float32


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
    raise ValueError(f"unknown precision profile {profile!r}; expected f32, bf16 or f16")


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return F32(1.0) / (F32(1.0) + np.exp(-x))


def silu(x: np.ndarray) -> np.ndarray:
    return x * sigmoid(x)


def softplus(x: np.ndarray, threshold: float | None = None) -> np.ndarray:
    """log(1 + e^x) in float32; with ``threshold`` (torch: 20) x itself above it."""
    sp = np.logaddexp(F32(0.0), x)
    return sp if threshold is None else np.where(x > threshold, x, sp)


def rms_normalize(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) over the last axis, in float32."""
    var = np.mean(x * x, axis=-1, keepdims=True, dtype=F32)
    return x * (F32(1.0) / np.sqrt(var + F32(eps)))


def l2_normalize(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return x * (F32(1.0) / np.sqrt(np.sum(x * x, axis=-1, keepdims=True, dtype=F32) + F32(eps)))


def matmul_t(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w.T with float32 operands and accumulation."""
    return np.matmul(f32(x), f32(w).T)


def expand_heads(x: np.ndarray, num_v_heads: int) -> np.ndarray:
    """[..., Hk, d] -> [..., Hv, d] by repeat_interleave (value head j reads key head j // r)."""
    return np.repeat(x, num_v_heads // x.shape[-2], axis=-2)


def delta_rule_recurrent_f32(q, k, v, g, beta, state, scale, *, scale_at="q", state_store=None):
    """Token-by-token gated delta rule in float32 (reference: ``delta_rule_recurrent``).

    q, k: [B, T, Hv, dk] (already expanded); v: [B, T, Hv, dv]; g, beta: [B, T, Hv]; state
    [B, Hv, dk, dv] float32. ``scale_at="q"`` folds the scale into q (HF, FLA), ``"out"`` multiplies
    the output (metrale). ``state_store`` rounds the state after every token (a bf16 state).
    Returns core [B, T, Hv, dv] and the new state.
    """
    S = f32(state).copy()
    T = v.shape[1]
    qs = q * F32(scale) if scale_at == "q" else q
    core = np.empty(v.shape, dtype=F32)
    decay = np.exp(g)
    for t in range(T):
        S *= decay[:, t, :, None, None]
        m = np.einsum("bhk,bhkv->bhv", k[:, t], S)
        delta = beta[:, t, :, None] * (v[:, t] - m)
        S += k[:, t, :, :, None] * delta[:, :, None, :]
        if state_store is not None:
            S = state_store(S)
        o = np.einsum("bhk,bhkv->bhv", qs[:, t], S)
        core[:, t] = o * F32(scale) if scale_at == "out" else o
    return core, S


def _unit_lower_inverse_f32(A: np.ndarray) -> np.ndarray:
    """(I + A)^-1 for strictly lower-triangular A [..., C, C], by forward substitution in float32."""
    C = A.shape[-1]
    inv = np.zeros_like(A)
    idx = np.arange(C)
    inv[..., idx, idx] = 1.0
    for i in range(1, C):
        inv[..., i, :i] = -np.einsum("...j,...jc->...c", A[..., i, :i], inv[..., :i, :i])
    return inv


def delta_rule_chunked_f32(q, k, v, g, beta, state, scale, *, chunk_size=64, lowp=None, scale_at="out"):
    """The chunked (WY/UT) gated delta rule in float32 (reference: ``delta_rule_chunked``).

    Decay factors come from differences of chunk-local cumulative sums of g, as HF and FLA compute
    them. ``lowp``, when given, rounds to the activation dtype where FLA's chunk kernels store it:
    the inverse (I+A)^-1, w and u, the state operand of w@h and q@h, the decayed v_new, the masked
    q k^T block, and q, k themselves. Without it every intermediate stays float32 (HF's fallback).
    ``scale_at="q"`` folds the scale into q first (HF), ``"out"`` scales the output (FLA).
    Shapes as :func:`delta_rule_recurrent_f32`.
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
    for n in range(N):
        Qn, Kn, Vn, gn, bn = Q[:, :, n], K[:, :, n], V[:, :, n], G[:, :, n], Bt[:, :, n]
        gamma = np.cumsum(gn, axis=-1, dtype=F32)
        diff = gamma[..., :, None] - gamma[..., None, :]
        with np.errstate(over="ignore"):
            E = np.where(lower, np.exp(np.where(lower, diff, F32(0.0))), F32(0.0))
        A = np.where(strict, bn[..., :, None] * (Kn @ np.swapaxes(Kn, -1, -2)) * E, F32(0.0))
        Tinv = r(_unit_lower_inverse_f32(A))
        W = r(Tinv @ r(Kn * (bn * np.exp(gamma))[..., None]))
        U = r(Tinv @ r(Vn * bn[..., None]))
        Vp = U - W @ r(S)
        QK = r(np.where(lower, (Qn @ np.swapaxes(Kn, -1, -2)) * E, F32(0.0)))
        out[:, :, n] = F32(scale) * ((Qn * np.exp(gamma)[..., None]) @ r(S) + QK @ r(Vp))
        last = gamma[..., -1:]
        Vd = r(Vp * np.exp(last - gamma)[..., None])
        S = S * np.exp(last)[..., None] + np.swapaxes(Kn, -1, -2) @ Vd
    core = np.moveaxis(out.reshape(B, Hv, N * C, dv)[:, :, :T], 1, 2)
    return np.ascontiguousarray(core), S
