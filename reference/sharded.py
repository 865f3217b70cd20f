"""The layer sharded across ranks, in float64: what each rank of a tensor- or context-parallel port
computes, so that a port can be judged rank by rank (docs/sharding.md; the plans: :mod:`gdncheck.sharding`).

Tensor parallelism: rank r runs every stage on its share of the heads with its slice of the weights
(:func:`gdncheck.sharding.rank_weights`) and its state shards, and stops at its ``out_proj`` *partial* (``core_gated`` of its
value heads times its columns of ``out_proj``); the layer's ``attn_out`` is the sum of the partials.
The stage functions are the unsharded ones: a rank is the same math on fewer heads.

Context parallelism: a rank owns a token range. It receives the **conv halo** (the conv state at its
first token: the last K pre-conv columns before it) and the recurrent state at its first token, which it
composes from its predecessors' **affine summaries**: over a token range the delta rule maps the state
affinely, per value head ``S_end = M · S_start + U`` with the dk×dk *transition*

    M = A_{e−1} ⋯ A_s,   A_t = e^{g_t} (I − β_t k_t k_tᵀ)

and the dk×dv *bias* ``U`` (the range run from the zero state), since ``S_t = A_t S_{t−1} + β_t k_t v_tᵀ``
(:func:`.delta_rule.delta_rule_recurrent`). Summaries compose in token order:
``(M₂, U₂) ∘ (M₁, U₁) = (M₂ M₁, M₂ U₁ + U₂)``.

Tensor × context parallelism (:func:`tpcp_forward`): rank r runs its TP share's heads (a standalone layer of
them, :func:`gdncheck.sharding.standalone`) on its CP rank's segments: its halo is its own channels' pre-conv
rows, its summaries its own value heads', its partial its heads' ``out_proj`` columns on its tokens; the
layer's ``attn_out`` on a segment is the sum of its TP group's partials there.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.sharding import (
    A_LOG,
    CONV,
    DT_BIAS,
    NORM,
    OUT,
    QKV,
    A,
    B,
    CPPlan,
    RankShare,
    TPCPPlan,
    TPPlan,
    Z,
    rank_weights,
    share_order,
    standalone,
    state_shards,
)

from . import arith
from .conv1d import conv1d
from .delta_rule import delta_rule_recurrent
from .functions import f64
from .gated_norm import gated_norm
from .gates import gates
from .in_proj import in_proj
from .input_norm import input_norm
from .layer import Params, layer_forward, layer_tail
from .out_proj import out_proj
from .qk_norm import qk_norm


def expand_to_values(x: np.ndarray, key_of_value: np.ndarray) -> np.ndarray:
    """[..., T, Hk_r, d] -> [..., T, Hv_r, d]: the rank's value head i reads its key head ``key_of_value[i]``."""
    return np.take(x, key_of_value, axis=-2)


def rank_forward(cfg: GDNConfig, share: RankShare, w: Mapping[str, np.ndarray], x: np.ndarray,
                 conv_state: np.ndarray, recurrent_state: np.ndarray):
    """One call of tensor-parallel rank ``share.rank``: x [B, T, D] (replicated), its state shards, its
    weights (:func:`rank_weights`). Returns ``(partial, conv_state, recurrent_state, trace)``: ``partial``
    [B, T, D] is its ``out_proj`` partial (before the all-reduce); the trace holds the stage tensors of its
    share (``qkv``: its channels ``q | k | v``; ``q``, ``k``: its key heads; the rest: its value heads)."""
    eps = cfg.rms_norm_eps
    nk, nv = share.k_stop - share.k_start, share.v_stop - share.v_start
    x_norm = input_norm(x, w["input_layernorm.weight"], eps)
    qkv, z, a, b = in_proj(x_norm, w[QKV], w[Z], w[A], w[B])
    qkv_conv, conv_state = conv1d(qkv, conv_state, w[CONV])
    q, k, v = qk_norm(qkv_conv, nk, cfg.head_k_dim, nv, cfg.head_v_dim)
    g, beta = gates(a, b, w[A_LOG], w[DT_BIAS])
    kv = share.key_of_value(cfg)
    core, recurrent_state = delta_rule_recurrent(expand_to_values(q, kv), expand_to_values(k, kv), v, g, beta,
                                                 recurrent_state, cfg.scale)
    core_gated = gated_norm(core, z, w[NORM], eps)
    partial = out_proj(core_gated, w[OUT])
    trace = {"x_norm": x_norm, "qkv": qkv, "z": z, "a": a, "b": b, "qkv_conv": qkv_conv, "q": q, "k": k, "v": v,
             "g": g, "beta": beta, "core": core, "core_gated": core_gated, "attn_out_partial": partial}
    return partial, conv_state, recurrent_state, trace


# --- context parallelism ------------------------------------------------------------------------


def transition(k: np.ndarray, g: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """M = A_{T−1} ⋯ A_0 with A_t = e^{g_t}(I − β_t k_t k_tᵀ), per sequence and value head.

    k: [B, T, Hv, dk] (each value head's key, L2-normalised); g, beta: [B, T, Hv]. Returns [B, Hv, dk, dk]."""
    k, g, beta = f64(k), f64(g), f64(beta)
    Bn, T, Hv, dk = k.shape
    M = np.broadcast_to(np.eye(dk), (Bn, Hv, dk, dk)).copy()
    decay = arith.exp(g)
    for t in range(T):
        k_t = k[:, t]  # [B, Hv, dk]
        kM = arith.matmul(k_t[:, :, None, :], M)  # k_tᵀ M: [B, Hv, 1, dk]
        M = decay[:, t, :, None, None] * (M - beta[:, t, :, None, None] * k_t[:, :, :, None] * kM)
    return M


def summary(k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The affine summary ``(M, U)`` of a token range: ``S_end = M · S_start + U`` per value head.

    k: [B, T, Hv, dk] (expanded to the value heads); v: [B, T, Hv, dv]; g, beta: [B, T, Hv].
    M: [B, Hv, dk, dk] (:func:`transition`); U: [B, Hv, dk, dv], the range run from the zero state."""
    _, U = delta_rule_recurrent(k, k, v, g, beta, None, 1.0)
    return transition(k, g, beta), U


def compose(later: tuple[np.ndarray, np.ndarray], earlier: tuple[np.ndarray, np.ndarray]):
    """``later ∘ earlier``: the summary of two adjacent ranges, ``(M₂ M₁, M₂ U₁ + U₂)``."""
    (M2, U2), (M1, U1) = later, earlier
    return arith.matmul(M2, M1), arith.matmul(M2, U1) + U2


def apply(summ: tuple[np.ndarray, np.ndarray], state: np.ndarray) -> np.ndarray:
    """``M · S + U``: the state at the end of a range entered with ``state`` [B, Hv, dk, dv]."""
    M, U = summ
    return arith.matmul(M, f64(state)) + U


def conv_halo(qkv: np.ndarray, conv_state: np.ndarray, start: int) -> np.ndarray:
    """The conv state at token ``start`` of a call: the last K pre-conv columns before it, oldest first
    (``conv_state``'s columns, then the call's ``qkv`` rows). qkv: [B, T, C]; conv_state: [B, C, K].
    Returns [B, C, K]; a rank's outputs read its newest K − 1 columns."""
    K = conv_state.shape[-1]
    cols = np.concatenate([f64(conv_state), np.swapaxes(f64(qkv[:, :start]), -1, -2)], axis=-1)
    return np.ascontiguousarray(cols[..., cols.shape[-1] - K:])


def tp_forward(cfg: GDNConfig, weights: Mapping[str, np.ndarray], plan: TPPlan, x: np.ndarray,
               conv_state: np.ndarray, recurrent_state: np.ndarray):
    """Every rank of a tensor-parallel plan on one call, then the all-reduce and the layer's tail.

    Returns ``(out, ranks, tail)``: ``ranks[r]`` is rank r's ``{"partial", "conv_state", "recurrent_state",
    "trace"}``; ``tail`` the stages after ``out_proj`` (``attn_out`` = Σ partials, ``h``, ..., ``out``)."""
    ranks = []
    for share in plan.shares:
        conv_r, rec_r = state_shards(cfg, share, conv_state, recurrent_state)
        partial, conv_r, rec_r, trace = rank_forward(cfg, share, rank_weights(cfg, weights, share), x, conv_r, rec_r)
        ranks.append({"partial": partial, "conv_state": conv_r, "recurrent_state": rec_r, "trace": trace})
    attn_out = sum(r["partial"] for r in ranks)
    out, tail = layer_tail(cfg, Params({n: f64(w) for n, w in weights.items()}), f64(x), attn_out)
    return out, ranks, tail


def cp_forward(cfg: GDNConfig, weights: Mapping[str, np.ndarray], plan: CPPlan, x: np.ndarray,
               conv_state: np.ndarray, recurrent_state: np.ndarray):
    """One call split over the ranks of a context-parallel plan, as the ranks exchange it.

    1. Each segment's pre-conv ``qkv`` (rank-local); the **halo** of a segment is the conv state at its
       first token (:func:`conv_halo`; the call's conv state, then earlier segments' rows).
    2. Each segment's **summary** (:func:`summary`) from its own ``k, v, g, beta`` (computed with its halo).
    3. Each segment's **entry state**: the call's recurrent state through its predecessors' summaries in
       token order (in zigzag, rank 0's second piece enters last).
    4. Each segment's outputs: the unsharded layer on its tokens from its halo and entry state.

    x: [B, T, D]. Returns ``(segments, final)``: ``segments[i]`` for ``plan.segments[i]`` holds ``rank``,
    ``tokens`` (start, stop), ``halo``, ``summary`` (M, U), ``entry_state``, ``out``, ``trace``,
    ``conv_state`` and ``recurrent_state`` (after it); ``final`` the call's ``(conv_state, recurrent_state)``,
    the last segment's."""
    params = Params({n: f64(w) for n, w in weights.items()})
    x = f64(x)
    qkv = in_proj(input_norm(x, params["input_layernorm.weight"], cfg.rms_norm_eps),
                  params[QKV], params[Z], params[A], params[B])[0]
    segments = []
    entry = f64(recurrent_state)
    for rank, start, stop in plan.segments:
        halo = conv_halo(qkv, conv_state, start)
        out, conv_after, rec_after, trace = layer_forward(cfg, params, x[:, start:stop], halo, entry,
                                                          delta_rule="recurrent")
        ke = expand_to_values(trace["k"], np.arange(cfg.num_v_heads) // cfg.head_ratio)
        summ = summary(ke, trace["v"], trace["g"], trace["beta"])
        segments.append({"rank": rank, "tokens": (start, stop), "halo": halo, "summary": summ, "entry_state": entry,
                         "out": out, "trace": trace, "conv_state": conv_after, "recurrent_state": rec_after})
        entry = apply(summ, entry)  # what the next segment receives: its predecessors' summaries composed
    return segments, (segments[-1]["conv_state"], segments[-1]["recurrent_state"])


def tpcp_forward(cfg: GDNConfig, weights: Mapping[str, np.ndarray], plan: TPCPPlan, x: np.ndarray,
                 conv_state: np.ndarray, recurrent_state: np.ndarray):
    """One call under a tensor × context-parallel plan, every rank in float64.

    Each TP share runs as a standalone layer of its heads (:func:`gdncheck.sharding.standalone`) through
    :func:`cp_forward` from its shards of the entering state; rank r keeps its CP rank's segments. Returns
    ``(ranks, attn_out)``: ``ranks[r]`` maps each segment index it owns to ``{"tokens", "halo"`` (its conv
    channels, ``q | k | v``), ``"summary"`` (M, U of its value heads), ``"entry_state"``, ``"attn_out_partial"``
    ([B, n, D]), ``"attn_out"`` (its TP group's partials summed), ``"recurrent_state"`` (after the segment)``}``;
    ``attn_out`` [B, T, D] the segments' reduced outputs stitched in token order."""
    x = f64(x)
    per_share = []
    for share in plan.tp.shares:
        cfg_r, w_r, conv_index = standalone(cfg, share, weights)
        back = share_order(conv_index, len(share.conv_channels(cfg)))
        conv_r, rec_r = state_shards(cfg, share, conv_state, recurrent_state)
        segs, _ = cp_forward(cfg_r, w_r, plan.cp, x, conv_r[:, conv_index], rec_r)
        per_share.append([{"tokens": s["tokens"], "halo": s["halo"][:, back], "summary": s["summary"],
                           "entry_state": s["entry_state"], "attn_out_partial": s["trace"]["attn_out"],
                           "recurrent_state": s["recurrent_state"]} for s in segs])
    reduced = [sum(per_share[t][i]["attn_out_partial"] for t in range(plan.tp.world))
               for i in range(len(plan.cp.segments))]
    ranks = []
    for r in range(plan.world):
        own = [i for i, (c, _, _) in enumerate(plan.cp.segments) if c == plan.cp_rank(r)]
        ranks.append({i: {**per_share[plan.tp_rank(r)][i], "attn_out": reduced[i]} for i in own})
    attn_out = np.zeros((x.shape[0], x.shape[1], cfg.hidden_size))
    for i, (_, a, b) in enumerate(plan.cp.segments):
        attn_out[:, a:b] = reduced[i]
    return ranks, attn_out
