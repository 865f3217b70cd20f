"""Hypothesis strategies for the property suite: configurations, weights, inputs, gate regimes
and call programs of the GDN layer, all tiny (the Triton interpreter runs every example).

Every value a property draws goes through ``data.draw(strategy, label=...)`` with one of the
labels below, so a failure reads as a list of named draws. Weights and inputs are made from a
drawn seed by :mod:`gdncheck.synthetic` (every value exact in bf16 and f16): the seed is what
Hypothesis shrinks, the arrays are what the layer sees. As in the fixture suite, the draws follow
the realistic regime of a trained layer half of the time (``realistic`` weights and inputs:
long memories, unit-order activations, massive channels) and otherwise take one of the other
regimes, among them each edge of the suite's edge cases (fixtures/cases.py ``EDGES``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from gdncheck.config import GDNConfig
from gdncheck.dtypes import round_to_common
from gdncheck.fixtures.edge_weights import F16_STATE_FORGET
from gdncheck.portable import log
from gdncheck.synthetic import (
    add_bias,
    inverse_softplus,
    make_inputs,
    make_weights,
    massive_channels,
    realistic_inputs,
    realistic_weights,
)
from gdncheck.weights import LayerWeights

#: Input regimes besides ``realistic`` (:func:`gdncheck.synthetic.realistic_inputs`): ``normal``;
#: ``outliers`` (5% of elements x20, like massive activations); ``tiny`` and ``huge`` norms (x 2^-6
#: and x 2^8, still normal numbers in f16); ``repeated`` (one token T times); ``norm_eps`` (realistic,
#: every third token with a mean square of the RMSNorm's eps).
INPUT_KINDS = ("normal", "outliers", "tiny", "huge", "repeated", "norm_eps")

#: Weight regimes besides ``realistic`` (:func:`gdncheck.synthetic.realistic_weights`). From a
#: checkpoint-like draw (``make_weights``): ``checkpoint`` as drawn; ``fast_decay`` (A up to e^3,
#: dt_bias 4: g down to about -80); ``slow_decay`` (A = e^-6: g near 0); ``strong_writes`` /
#: ``weak_writes`` (in_proj_b scaled x8 / x0: beta pushed to 0 or 1, and 0.5). From a realistic
#: draw, the edges of the fixture suite: ``qk_eps`` (key head 0's q, k with squared norms near 1e-6),
#: ``gated_eps`` (value head 0's core near the gated norm's eps), ``softplus_edges`` (a + dt_bias
#: ≈ 24, -30, -20 with A = e^16.5, 20), ``sigmoid_tails`` (b ≈ -22 and +22), ``state_norms`` (a
#: state past 1000 and one near 1e-5), ``decay_one`` (a decay of 1 - 1e-8), ``f16_state`` (decays of
#: 1 - 2e-4 and writes mostly below an f16 state's rounding, a strong one now and then).
GATE_REGIMES = ("checkpoint", "fast_decay", "slow_decay", "strong_writes", "weak_writes", "qk_eps", "gated_eps",
                "softplus_edges", "sigmoid_tails", "state_norms", "decay_one", "f16_state")
REALISTIC = "realistic"


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


def weight_draws(regimes=None, norm_modes=("shared", "per_head")):
    """A weights draw: ``realistic`` half of the time and one of ``regimes`` (default every one of
    :data:`GATE_REGIMES`) otherwise; exactly ``regimes`` when given."""
    regime = st.one_of(st.just(REALISTIC), st.sampled_from(GATE_REGIMES)) if regimes is None \
        else st.sampled_from(regimes)
    return st.builds(WeightsDraw, st.integers(0, 2**16), st.sampled_from(norm_modes),
                     st.sampled_from((0.02, 0.05)), regime)


def build_weights(cfg: GDNConfig, w: WeightsDraw) -> LayerWeights:
    """The layer weights of a draw: a checkpoint-like or realistic layer, then the regime applied."""
    if w.regime == REALISTIC or w.regime in _EDGES:
        base = realistic_weights(cfg, w.seed, norm_mode=w.norm_mode)
    else:
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
    elif w.regime in _EDGES:
        _EDGES[w.regime](cfg, arrays)
    out = {k: round_to_common(v).astype(np.float32) for k, v in arrays.items()}
    return LayerWeights(out, stored_dtypes=dict(base.stored_dtypes), source=repr(w), config=cfg)


def _v_rows(cfg: GDNConfig, head: int) -> slice:
    start = 2 * cfg.key_dim + head * cfg.head_v_dim
    return slice(start, start + cfg.head_v_dim)


def _qk_eps(cfg: GDNConfig, w: dict) -> None:
    qkv = w["linear_attn.in_proj_qkv.weight"]
    # realistic pre-SiLU squared norms grow with dk (several dk, with synthetic.QK_MEAN); SiLU's slope
    # near 0 is 1/2: q and k come out with squared norms near 1e-6, the eps
    f = 2e-4 * np.sqrt(16.0 / cfg.head_k_dim)
    qkv[: cfg.head_k_dim] *= f
    qkv[cfg.key_dim: cfg.key_dim + cfg.head_k_dim] *= f


def _gated_eps(cfg: GDNConfig, w: dict) -> None:
    w["linear_attn.in_proj_qkv.weight"][_v_rows(cfg, 0)] *= 0.15


def _softplus_edges(cfg: GDNConfig, w: dict) -> None:
    heads = [(log(0.05), 24.0), (log(16.0), 24.0), (log(1e-4), -30.0), (16.5, -20.0), (log(0.5), 20.0)]
    for h, (a_log, dt) in zip(range(cfg.num_v_heads), heads):
        w["linear_attn.A_log"][h], w["linear_attn.dt_bias"][h] = a_log, dt


def _sigmoid_tails(cfg: GDNConfig, w: dict) -> None:
    b = w["linear_attn.in_proj_b.weight"]
    b *= 0.25
    b[:, massive_channels(cfg.hidden_size)] = 0.0
    add_bias(w, "linear_attn.in_proj_b.weight", np.resize([-22.0, 22.0], cfg.num_v_heads), cfg.hidden_size)


def _state_norms(cfg: GDNConfig, w: dict) -> None:
    w["linear_attn.in_proj_qkv.weight"][_v_rows(cfg, 0)] *= 2500.0
    if cfg.num_v_heads > 1:
        last = cfg.num_v_heads - 1
        w["linear_attn.in_proj_qkv.weight"][_v_rows(cfg, last)] *= 1e-3
        w["linear_attn.in_proj_b.weight"][last] *= 0.25
        w["linear_attn.in_proj_b.weight"][last, massive_channels(cfg.hidden_size)] = 0.0
        bias = np.zeros(cfg.num_v_heads)
        bias[last] = -9.0
        add_bias(w, "linear_attn.in_proj_b.weight", bias, cfg.hidden_size)


def _decay_one(cfg: GDNConfig, w: dict) -> None:
    w["linear_attn.A_log"][0] = log(0.01)
    w["linear_attn.dt_bias"][0] = inverse_softplus(np.array(1e-6))


def _f16_state(cfg: GDNConfig, w: dict) -> None:
    """The f16-state edge (fixtures/cases.py): A = 1 and decays of 1 − 2.2e-4 and 1 − 1.8e-4 on every
    token (a nearly constant), writes mostly of beta ≈ 6e-6 (b ≈ −12), which an f16 state cannot take
    (it moves only by more than 2.4e-4 of itself), and on about one token in twelve a strong one (b's
    own part ×6; 2 to 15 % of the token-heads over 40 draws: where the fixture case has a control
    channel, the draw has its tokens' spread)."""
    w["linear_attn.A_log"][:] = 0.0
    w["linear_attn.dt_bias"][:] = inverse_softplus(np.resize(F16_STATE_FORGET, cfg.num_v_heads))
    w["linear_attn.in_proj_a.weight"] *= 0.005
    b = w["linear_attn.in_proj_b.weight"]
    b *= 6.0
    b[:, massive_channels(cfg.hidden_size)] = 0.0
    add_bias(w, "linear_attn.in_proj_b.weight", np.full(cfg.num_v_heads, -12.0), cfg.hidden_size)


_EDGES = {"qk_eps": _qk_eps, "gated_eps": _gated_eps, "softplus_edges": _softplus_edges,
          "sigmoid_tails": _sigmoid_tails, "state_norms": _state_norms, "decay_one": _decay_one,
          "f16_state": _f16_state}


@dataclass(frozen=True)
class InputDraw:
    seed: int
    kind: str

    def __repr__(self) -> str:
        return f"inputs(seed={self.seed}, kind={self.kind})"


def input_draws(kinds=None):
    """An inputs draw: ``realistic`` half of the time and one of ``kinds`` (default :data:`INPUT_KINDS`)
    otherwise; exactly ``kinds`` when given."""
    kind = st.one_of(st.just(REALISTIC), st.sampled_from(INPUT_KINDS)) if kinds is None else st.sampled_from(kinds)
    return st.builds(InputDraw, st.integers(0, 2**16), kind)


def build_inputs(cfg: GDNConfig, batch: int, tokens: int, d: InputDraw) -> np.ndarray:
    """x [B, T, D] float32 for an input draw (exact in bf16 and f16)."""
    if d.kind in (REALISTIC, "norm_eps"):
        x = realistic_inputs(cfg, batch, tokens, d.seed)
        if d.kind == "norm_eps":
            tiny = np.arange(tokens) % 3 == 1
            rms = np.sqrt(np.mean(x * x, axis=-1, keepdims=True))
            x = np.where(tiny[None, :, None], x / rms * np.sqrt(cfg.rms_norm_eps), x)
    elif d.kind == "outliers":
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
