"""Small shared helpers for tests: tiny configs and random inputs."""

from __future__ import annotations

import numpy as np

from gdncheck.config import GDNConfig


def tiny_config(Hk=2, Hv=4, dk=4, dv=3, D=8, I=12, K=4, **kw) -> GDNConfig:
    return GDNConfig(hidden_size=D, intermediate_size=I, num_k_heads=Hk, num_v_heads=Hv, head_k_dim=dk,
                     head_v_dim=dv, conv_kernel=K, **kw)


def unit(rng, *shape):
    x = rng.normal(size=shape)
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


def delta_inputs(rng, B, T, Hk, Hv, dk, dv, g_range=(-2.0, 0.0), beta_range=(0.0, 1.0)):
    q = unit(rng, B, T, Hk, dk)
    k = unit(rng, B, T, Hk, dk)
    v = rng.normal(size=(B, T, Hv, dv))
    g = rng.uniform(*g_range, size=(B, T, Hv))
    beta = rng.uniform(*beta_range, size=(B, T, Hv))
    return q, k, v, g, beta


def rel_err(a, b) -> float:
    """max |a - b| / max |b| (normwise relative error; 0 when both are zero)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    denom = np.abs(b).max() if b.size else 0.0
    num = np.abs(a - b).max() if a.size else 0.0
    return float(num / denom) if denom > 0 else float(num)


#: Unit roundoff of each profile's activation dtype (half its machine epsilon).
UNIT_ROUNDOFF = {"f32": 2.0**-24, "bf16": 2.0**-8, "f16": 2.0**-11}


def routing_decided(router_logits, top_k: int, profile: str) -> np.ndarray:
    """[..., T] bool: the tokens whose selected experts no correct port of ``profile`` can change when
    it routes the *same* h_norm (a stage-chained comparison): the gap between the k-th and (k+1)-th
    router logits is over 4·u·(|l_(k)| + |l_(k+1)|) + 1e-4, twice what rounding both logits to the
    profile's dtype moves it, plus room for float32 GEMM accumulation (docs/moe.md, "What the
    fixture cases need"). With top_k = E every token is decided."""
    logits = np.asarray(router_logits, dtype=np.float64)
    if top_k >= logits.shape[-1]:
        return np.ones(logits.shape[:-1], dtype=bool)
    top = -np.sort(-logits, axis=-1)[..., top_k - 1: top_k + 1]
    bound = 4 * UNIT_ROUNDOFF[profile] * np.abs(top).sum(-1) + 1e-4
    return top[..., 0] - top[..., 1] > bound
