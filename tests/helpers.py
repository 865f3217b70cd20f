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
