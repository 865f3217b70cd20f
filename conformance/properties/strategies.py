"""Hypothesis strategies for the property suite: configurations, weights, inputs, gate regimes
and call programs of the GDN layer, all tiny (the Triton interpreter runs every example).

Every value a property draws goes through ``data.draw(strategy, label=...)`` with one of the
labels below, so a failure reads as a list of named draws. Weights and inputs are made from a
drawn seed by :mod:`gdncheck.synthetic` (weights like a Hugging Face checkpoint, every value exact
in bf16 and f16): the seed is what Hypothesis shrinks, the arrays are what the layer sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from gdncheck.config import GDNConfig
from gdncheck.dtypes import round_to_common
from gdncheck.synthetic import make_inputs, make_weights
from gdncheck.weights import LayerWeights

#: Input regimes: ``normal``; ``outliers`` (5% of elements x20, like massive activations); ``tiny``
#: and ``huge`` norms (x 2^-6 and x 2^8, still normal numbers in f16); ``repeated`` (one token T times).
INPUT_KINDS = ("normal", "outliers", "tiny", "huge", "repeated")

#: Gate regimes (weights of the decay and write-strength inputs): ``checkpoint`` as drawn;
#: ``fast_decay`` (A up to e^3, dt_bias 4: g down to about -80); ``slow_decay`` (A = e^-6: g near 0);
#: ``strong_writes`` / ``weak_writes`` (in_proj_b scaled x8 / x0: beta pushed to 0 or 1, and 0.5).
GATE_REGIMES = ("checkpoint", "fast_decay", "slow_decay", "strong_writes", "weak_writes")


@st.composite
def configs(draw, *, max_heads: int = 6, norm_mode: str | None = None, dims=(4, 8, 16)) -> GDNConfig:
    """A layer configuration: Hk 1-2, Hv/Hk 1-3, head dims from ``dims`` (dk != dv allowed),
    conv kernel 1-4, eps from 1e-6 to 1e-3, D 16 or 32 and I 16 or 48."""
    Hk = draw(st.integers(1, 2))
    r = draw(st.integers(1, max(1, min(3, max_heads // Hk))))
    dk = draw(st.sampled_from(dims))
    dv = draw(st.sampled_from(dims))
    return GDNConfig(hidden_size=draw(st.sampled_from((16, 32))), intermediate_size=draw(st.sampled_from((16, 48))),
                     num_k_heads=Hk, num_v_heads=Hk * r, head_k_dim=dk, head_v_dim=dv,
                     conv_kernel=draw(st.integers(1, 4)), rms_norm_eps=draw(st.sampled_from((1e-6, 1e-5, 1e-3))),
                     norm_mode=norm_mode)


@dataclass(frozen=True)
class WeightsDraw:
    seed: int
    norm_mode: str
    std: float
    regime: str

    def __repr__(self) -> str:
        return f"weights(seed={self.seed}, norm_mode={self.norm_mode}, std={self.std}, gates={self.regime})"


def weight_draws(regimes=GATE_REGIMES, norm_modes=("shared", "per_head")):
    return st.builds(WeightsDraw, st.integers(0, 2**16), st.sampled_from(norm_modes),
                     st.sampled_from((0.02, 0.05)), st.sampled_from(regimes))


def build_weights(cfg: GDNConfig, w: WeightsDraw) -> LayerWeights:
    """The layer weights of a draw: a checkpoint-like layer, then the gate regime applied."""
    base = make_weights(cfg, w.seed, norm_mode=w.norm_mode, std=w.std)
    arrays = {k: np.array(v, dtype=np.float64) for k, v in base.items()}
    Hv = cfg.num_v_heads
    if w.regime == "fast_decay":
        arrays["linear_attn.A_log"] = np.linspace(1.0, 3.0, Hv)
        arrays["linear_attn.dt_bias"] = np.full(Hv, 4.0)
    elif w.regime == "slow_decay":
        arrays["linear_attn.A_log"] = np.full(Hv, -6.0)
    elif w.regime == "strong_writes":
        arrays["linear_attn.in_proj_b.weight"] *= 8.0
    elif w.regime == "weak_writes":
        arrays["linear_attn.in_proj_b.weight"] *= 0.0
    out = {k: round_to_common(v).astype(np.float32) for k, v in arrays.items()}
    return LayerWeights(out, stored_dtypes=dict(base.stored_dtypes), source=repr(w), config=cfg)


@dataclass(frozen=True)
class InputDraw:
    seed: int
    kind: str

    def __repr__(self) -> str:
        return f"inputs(seed={self.seed}, kind={self.kind})"


def input_draws(kinds=INPUT_KINDS):
    return st.builds(InputDraw, st.integers(0, 2**16), st.sampled_from(kinds))


def build_inputs(cfg: GDNConfig, batch: int, tokens: int, d: InputDraw) -> np.ndarray:
    """x [B, T, D] float32 for an input draw (exact in bf16 and f16)."""
    if d.kind == "outliers":
        x = make_inputs(cfg, batch, tokens, d.seed, outliers=0.05)
    else:
        x = make_inputs(cfg, batch, tokens, d.seed, outliers=0.0)
        if d.kind == "tiny":
            x = x * 2.0 ** -6
        elif d.kind == "huge":
            x = x * 2.0 ** 8
        elif d.kind == "repeated":
            x = np.repeat(x[:, :1], tokens, axis=1)
    return round_to_common(x).astype(np.float32)


@st.composite
def splits(draw, total: int, max_parts: int = 4) -> list[int]:
    """Consecutive call lengths, each >= 1, summing to ``total``."""
    if total <= 1:
        return [total]
    n = draw(st.integers(1, min(max_parts, total)))
    cuts = sorted(draw(st.sets(st.integers(1, total - 1), min_size=n - 1, max_size=n - 1)))
    bounds = [0, *cuts, total]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def permutation_within_groups(Hk: int, r: int, order: list[list[int]]) -> np.ndarray:
    """Value-head permutation that permutes heads only inside each key group (j // r stays the same)."""
    perm = []
    for g in range(Hk):
        perm.extend(g * r + i for i in order[g])
    return np.array(perm)


@st.composite
def group_permutations(draw, Hk: int, r: int) -> np.ndarray:
    order = [draw(st.permutations(list(range(r)))) for _ in range(Hk)]
    return permutation_within_groups(Hk, r, order)
