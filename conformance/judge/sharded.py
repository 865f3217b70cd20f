"""Judging a sharded run rank by rank (docs/sharding.md): each rank's tensors against its share of the
unsharded goldens, bounded by the scale of the **whole** tensor (a rank whose heads carry a tiny part of
the output must not false-alarm on a slice-relative error), and the reduced output against the layer's.

A failure names the rank, the call or token range, the heads or channels, and the stage, and, where the
rank's tensor equals something else the run or the goldens hold, says what: its own ``out_proj`` partial
(the all-reduce did not run), twice the reduced output, another rank's share, the zero state, the state
at another token. Failures are ordered by call (or segment, in token order), then stage, then rank, so
the first one printed is the earliest stage that went wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.sharding import OUT, CPPlan, TPCPPlan, TPPlan

from .metrics import rule_of, scaled_error

#: the stages of a tensor-parallel rank, in the order they run
TP_STAGES = ("qkv", "qkv_conv", "g", "beta", "core", "core_gated", "attn_out_partial", "attn_out", "conv_state",
             "recurrent_state")
#: what a context-parallel segment is judged on, in the order a rank gets it
CP_STAGES = ("halo", "summary", "entry_state", "out")
#: what a tensor × context-parallel rank's segment is judged on (its share of each), in the order it gets it
TPCP_STAGES = ("halo", "summary", "entry_state", "attn_out_partial", "attn_out")
#: how close "equals" must be, as a fraction of the whole tensor's scale, at least (far below any bound a
#: failure exceeds); a low-precision port's tensor equals another within twice the bound it failed, and ten
#: times closer to it than to its golden (:func:`_equals_within`)
EQUALS = 1e-6


@dataclass(frozen=True)
class ShardFailure:
    rank: int
    where: int  # the call (TP) or segment (CP)
    stage: str
    ratio: float  # the error over the bound (inf: NaN, a missing tensor or a wrong shape)
    message: str
    #: the measured errors and their bounds (a record's ``shard``, :func:`_measured`; inf where the rank's tensor
    #: is of another shape or not finite; None where it is missing): ``rank``, ``max_err`` (of the whole tensor's
    #: scale, or g's and beta's own rule: ``rule``), ``nmse``, ``elem_bound``, ``nmse_bound`` (0: not bounded),
    #: ``tensor`` (the rank's tensor judged: a stage of :data:`TP_STAGES` or :data:`CP_STAGES`), ``share`` (its
    #: heads, channels or tokens)
    shard: dict | None = None


def _err(got: np.ndarray, want: np.ndarray, scale: float) -> float:
    if got.shape != want.shape:
        return float("inf")
    d = np.abs(np.asarray(got, dtype=np.float64) - want)
    return float("inf") if not np.all(np.isfinite(d)) else float(d.max(initial=0.0)) / max(scale, 1e-300)


def _own_rule(got, want, stage: str, profile: str | None) -> tuple[float, float] | None:
    """(max, mean square) of the error of a tensor whose rule does not depend on a scale (g's log decay, beta's
    relative error: metrics.RULES), elementwise as the table's bound was earned; None for the scaled tensors,
    which a rank's share judges by the whole tensor's scale."""
    if profile is None or stage not in ("g", "beta") or rule_of(stage) == "scaled" or np.shape(got) != np.shape(want):
        return None
    err = scaled_error(np.asarray(got, dtype=np.float64), want, stage, profile)
    if not np.all(np.isfinite(err)):
        return float("inf"), float("inf")
    return float(err.max(initial=0.0)), float(np.mean(err * err)) if err.size else 0.0


def _scale(t: np.ndarray) -> float:
    return float(np.max(np.abs(t), initial=0.0))


def _nmse(got, want, whole) -> float:
    """The share's mean squared error over the whole tensor's mean square (the table's per-call NMSE, for a
    share: a rank's error is not diluted by the other ranks' elements)."""
    if np.shape(got) != np.shape(want) or not np.size(want):
        return float("inf")
    d = np.asarray(got, dtype=np.float64) - want
    if not np.all(np.isfinite(d)):
        return float("inf")
    return float(np.mean(d * d)) / max(float(np.mean(np.square(whole))), 1e-300)


def _equals_within(e: float, bound: float) -> float:
    """How close (of the whole tensor's scale) a failing tensor must be to another to be said to equal it, where
    it misses its golden by ``e``: within twice the bound (a low-precision port rounds what it computed) and ten
    times closer than to the golden; never looser than :data:`EQUALS`."""
    return max(EQUALS, min(2.0 * bound, e / 10.0))


def _bound_of(bound, stage: str) -> float:
    """``bound``: one number for every stage, or a mapping stage -> bound (``None``: no such bound)."""
    if bound is None:
        return float("inf")
    return float(bound[stage]) if isinstance(bound, Mapping) else float(bound)


def _range(a: int, b: int) -> str:
    return f"{a}" if b - a == 1 else f"{a}–{b - 1}"


def judge_tp(cfg: GDNConfig, plan: TPPlan, ranks: list[dict], goldens: list[dict], *, bound: float,
             weights=None, nmse_bound=None, profile: str | None = None,
             measured: dict | None = None) -> tuple[list[ShardFailure], int]:
    """Judge a tensor-parallel run: ``ranks[r]`` is what rank r wrote (``calls.{k}.{tensor}``), ``goldens[k]``
    the unsharded trace of call k with its states after the call. ``weights`` (for the partials' goldens:
    ``core_gated`` of the rank's heads times its columns of ``out_proj``) default to none: then a rank's
    partial is judged by the sum of the partials against ``attn_out`` only. ``nmse_bound`` (one number or per
    stage; default none): each share's NMSE (:func:`_nmse`) is bounded too. ``profile`` (default none): g and
    beta are judged by their own rules (:func:`_own_rule`), as the table's bounds for them were earned, not by
    the whole tensor's scale. Returns the failures, in order, and the number of tensors judged. A tensor a rank
    did not write is a failure. ``measured`` (a dict, default none) receives, for every ``(call, stage)``, the
    figures of each rank whose tensor was compared (:func:`_measured`), passing or not."""
    failures, judged = [], 0
    for k, gold in enumerate(goldens):
        partials = {r: ranks[r].get(f"calls.{k}.attn_out_partial") for r in range(plan.world)}
        for stage in TP_STAGES:
            if stage not in gold and stage != "attn_out_partial" or (stage == "attn_out_partial" and (
                    "attn_out" not in gold or "core_gated" not in gold)):
                continue  # a call whose goldens do not keep this stage (FORMAT.md §4.2)
            b, nb = _bound_of(bound, stage), _bound_of(nmse_bound, stage)
            for share in plan.shares:
                r = share.rank
                want, whole, what = _tp_share(cfg, share, stage, gold, weights)
                got = ranks[r].get(f"calls.{k}.{stage}")
                if want is None:
                    if stage != "attn_out_partial" or got is None:
                        continue
                    want = _partial_from_sum(partials, gold["attn_out"], r)
                    if want is None:
                        continue
                judged += 1
                if got is None:
                    failures.append(ShardFailure(r, k, stage, float("inf"), f"rank {r}, call {k}, {stage} ({what}): "
                                                 f"missing, but every rank must write it"))
                    continue
                own = _own_rule(got, want, stage, profile)
                if own is not None:
                    e, n = own[0], own[1] if nmse_bound is not None else 0.0
                else:
                    e = _err(got, want, _scale(whole))
                    n = _nmse(got, want, whole) if nmse_bound is not None else 0.0
                rule = ({"g": "log_decay", "beta": "relative"}.get(stage) if own is not None else None) or "whole_scale"
                figures = _measured(r, e, b, n, nmse_bound is not None and nb, stage, what, rule)
                if measured is not None:
                    measured.setdefault((k, stage), []).append(figures)
                if e > b or n > nb:
                    def distance(x, y, scale=_scale(whole), own=own is not None):
                        """an error in the unit e is in: the own rule's, or of the whole tensor's scale"""
                        if own:
                            return _own_rule(x, y, stage, profile)[0]
                        return _err(x, y, max(scale, 1e-300))

                    fact = _shape_fact(stage, got, want) or _tp_fact(cfg, plan, share, stage, got, gold, partials, k,
                                                                      weights, distance, _equals_within(e, b))
                    failures.append(ShardFailure(r, k, stage, max(e / b, n / nb), _message(
                        r, f"call {k}", stage, what, got, want, e, b, fact, n, nmse_bound and nb,
                        {"g": "(log decay)", "beta": "(relative)"}.get(stage) if own is not None else None),
                        figures))
    return failures, judged


def _tp_share(cfg, share, stage, gold, weights):
    """(the golden share, the whole golden tensor, what the share is) of a stage on a rank."""
    ch, v = share.conv_channels(cfg), slice(share.v_start, share.v_stop)
    heads = f"value heads {_range(share.v_start, share.v_stop)}"
    if stage in ("qkv", "qkv_conv"):
        return gold[stage][..., ch], gold[stage], f"conv channels of key heads {_range(share.k_start, share.k_stop)}, {heads}"
    if stage in ("g", "beta"):
        return gold[stage][..., v], gold[stage], heads
    if stage in ("core", "core_gated"):
        return gold[stage][..., v, :], gold[stage], heads
    if stage == "conv_state":
        return gold[stage][:, ch], gold[stage], f"conv channels of key heads {_range(share.k_start, share.k_stop)}, {heads}"
    if stage == "recurrent_state":
        return gold[stage][:, v], gold[stage], heads
    if stage == "attn_out":
        return gold["attn_out"], gold["attn_out"], "the all-reduced output"
    # the partial: core_gated of its heads times its columns of out_proj
    if weights is None:
        return None, gold["attn_out"], f"the out_proj partial of {heads}"
    cg = gold["core_gated"][..., v, :]
    cols = share.value_channels(cfg)
    w = np.asarray(weights[OUT], dtype=np.float64)[:, cols]
    return cg.reshape(*cg.shape[:-2], -1) @ w.T, gold["attn_out"], f"the out_proj partial of {heads}"


#: the axis of a rank's tensor that holds its value heads, or its conv channels
_HEAD_AXIS = {"g": -1, "beta": -1, "core": -2, "core_gated": -2, "recurrent_state": 1}
_CHANNEL_AXIS = {"qkv": -1, "qkv_conv": -1, "conv_state": 1}


def _shape_fact(stage: str, got, want) -> str:
    """Where a rank's tensor differs from its share's shape on the heads' (or channels') axis alone: how many it
    holds, and, where more, that padding slots (a port's own layout) are never written."""
    g, w = np.shape(got), np.shape(want)
    for axes, what in ((_HEAD_AXIS, "value heads"), (_CHANNEL_AXIS, "conv channels")):
        if stage in axes and len(g) == len(w) and len(g) > abs(axes[stage]) - (axes[stage] < 0):
            a = axes[stage] % len(g)
            if g[a] != w[a] and all(x == y for i, (x, y) in enumerate(zip(g, w)) if i != a):
                more = ": a rank writes only its own heads, never the padding slots of a padded layout " \
                       "(docs/sharding.md)" if g[a] > w[a] else ""
                return f"holds {g[a]} {what} where its share has {w[a]}{more}"
    return ""


def _partial_from_sum(partials, attn_out, r):
    """Without weights: rank r's partial is judged as attn_out minus the other ranks' partials."""
    if any(p is None for p in partials.values()):
        return None
    return attn_out - sum(np.asarray(p, dtype=np.float64) for j, p in partials.items() if j != r)


def _tp_fact(cfg, plan, share, stage, got, gold, partials, k, weights, distance, within) -> str:
    """What a failing share equals instead, where it does: within ``within`` by ``distance(got, other)`` (the
    error in the unit the share was judged in)."""

    def close(a, b) -> bool:
        return a is not None and np.shape(a) == np.shape(b) and distance(np.asarray(b),
                                                                         np.asarray(a, np.float64)) <= within

    if stage == "attn_out":
        own = partials.get(share.rank)
        if close(own, got):
            return "equals its own out_proj partial: the all-reduce did not run"
        if close(2 * gold["attn_out"], got):
            return "equals 2× the reduced output: reduced twice"
        if close(plan.world * gold["attn_out"], got):
            return f"equals {plan.world}× the reduced output: reduced once too often on every rank"
    if not np.any(got):
        return "is zero everywhere"
    if stage == "attn_out_partial" and weights is not None and "core_gated" in gold:
        heads = _heads_miscounted(cfg, plan, share, got, gold, weights, close)
        if heads:
            return heads
    for other in plan.shares:
        if other.rank != share.rank:
            want, _, _ = _tp_share(cfg, other, stage, gold, weights)
            if close(want, got):
                return f"equals rank {other.rank}'s share (value heads {_range(other.v_start, other.v_stop)})"
    return ""


def _heads_miscounted(cfg, plan, share, got, gold, weights, close) -> str:
    """Where a rank's partial equals its own plus or minus whole heads' ``out_proj`` contributions (each head's
    ``core_gated`` times its columns), say which: a padding slot computing a copy of a real head (vLLM PR
    47759's padded ranks), another rank's head, or a real head masked out as padding."""
    want, _, _ = _tp_share(cfg, share, "attn_out_partial", gold, weights)
    cg = np.asarray(gold["core_gated"], dtype=np.float64)
    w = np.asarray(weights[OUT], dtype=np.float64)
    dv = cfg.head_v_dim
    if cg.ndim < 2 or cg.shape[-2] != cfg.num_v_heads or np.shape(got) != np.shape(want):
        return ""
    contrib = np.stack([(cg[..., h, :] @ w[:, h * dv:(h + 1) * dv].T).reshape(-1)
                        for h in range(cfg.num_v_heads)])
    diff = (np.asarray(got, dtype=np.float64) - want).reshape(-1)
    times = np.rint(np.linalg.lstsq(contrib.T, diff, rcond=None)[0]).astype(np.int64)
    if not np.any(times) or not close(want + (times @ contrib).reshape(want.shape), got):
        return ""
    owner = {h: s.rank for s in plan.shares for h in s.v_heads}
    said = []
    for h in np.flatnonzero(times):
        n, mine = int(times[h]), share.v_start <= h < share.v_stop
        if mine and n > 0:
            said.append(f"value head {h} counted {n + 1}× (a padding slot computing a copy of a real head)")
        elif mine:
            said.append(f"value head {h} left out" if n == -1 else f"value head {h} counted {n + 1}×")
        else:
            said.append(f"value head {h} of rank {owner[h]} added {n}×" if n > 0 else
                        f"value head {h} of rank {owner[h]} subtracted {-n}×")
    return "equals its partial with " + ", ".join(said)


def judge_cp(cfg: GDNConfig, plan: CPPlan, ranks: list[dict], trace: dict, states: list | None, *,
             bound: float, stages=CP_STAGES, nmse_bound=None, measured: dict | None = None
             ) -> tuple[list[ShardFailure], int]:
    """Judge a context-parallel run of one call: ``ranks[r]`` what rank r wrote (``segments.{i}.{stage}``;
    the summary as ``M`` and ``U``), ``trace`` the unsharded call's stage tensors by name ([B, T, ...]),
    ``states[t]`` the unsharded ``(conv_state, recurrent_state)`` after the call's first t tokens
    (``states[0]``: the entering state; needed for ``halo``, ``summary``, ``entry_state``). ``stages``: what
    every segment must hold, in the order a rank computes it (a port that exposes only some stage tensors,
    as fla does, names them). ``nmse_bound`` and ``measured`` (keyed ``(segment, stage)``) as :func:`judge_tp`'s.
    A rank that wrote a segment it does not own, or tokens outside its range, fails."""
    failures, judged = [], 0
    owned = {i: r for i, (r, _, _) in enumerate(plan.segments)}
    for r, written in enumerate(ranks):
        extra = sorted({int(n.split(".")[1]) for n in written if n.startswith("segments.")} - {
            i for i, o in owned.items() if o == r})
        if extra:
            failures.append(ShardFailure(r, extra[0], stages[-1], float("inf"), f"rank {r} wrote segments {extra} it does "
                                         f"not own (its segments: {[i for i, o in owned.items() if o == r]})"))
    for i, (r, a, b) in enumerate(plan.segments):
        seg = {n.split(".", 2)[2]: t for n, t in ranks[r].items() if n.startswith(f"segments.{i}.")}
        where = f"segment {i} (tokens {_range(a, b)})"
        for stage in stages:
            judged += 1
            if stage == "summary":
                if "M" not in seg or "U" not in seg:
                    want = got = None
                else:
                    got = np.asarray(seg["M"]) @ states[a][1] + np.asarray(seg["U"])
                    want = states[b][1]
                whole = states[b][1]
            elif stage in ("halo", "entry_state"):
                got, want = seg.get(stage), states[a][0 if stage == "halo" else 1]
                whole = want
            else:  # a stage tensor of the call: its tokens
                got, want, whole = seg.get(stage), trace[stage][:, a:b], trace[stage]
            if got is None:
                failures.append(ShardFailure(r, i, stage, float("inf"), f"rank {r}, {where}, {stage}: missing"))
                continue
            e, bd = _err(got, want, _scale(whole)), _bound_of(bound, stage)
            n, nb = (_nmse(got, want, whole), _bound_of(nmse_bound, stage)) if nmse_bound is not None else (0.0, 1.0)
            figures = _measured(r, e, bd, n, nmse_bound is not None and nb, stage, where, "whole_scale")
            if measured is not None:
                measured.setdefault((i, stage), []).append(figures)
            if e > bd or n > nb:
                fact = _cp_fact(plan, i, stage, np.asarray(got), states, ranks, a, _scale(whole),
                                _equals_within(e, bd))
                if np.shape(got) != np.shape(want) and stage not in ("halo", "entry_state", "summary"):
                    fact = f"holds {np.shape(got)[1]} tokens where its share is {b - a}: the call was not split"
                failures.append(ShardFailure(r, i, stage, max(e / bd, n / nb), _message(
                    r, where, stage, "its tokens", got, want, e, bd, fact, n, nmse_bound is not None and nb),
                    figures))
    order = list(stages)
    failures.sort(key=lambda f: (f.where, order.index(f.stage) if f.stage in order else -1, f.rank))
    return failures, judged


def _cp_fact(plan, i, stage, got, states, ranks, a, scale, within) -> str:
    """What a failing segment's tensor equals instead, where it does: within ``within`` of ``scale``."""
    scale = max(scale, 1e-300)
    if not np.any(got):
        return {"halo": "equals the zero state: no halo was received",
                "entry_state": "equals the zero state: the predecessors' summaries were not applied"}.get(
                    stage, "is zero everywhere")
    if stage in ("halo", "entry_state"):
        part = 0 if stage == "halo" else 1
        for t, st in enumerate(states):
            if st is not None and t != a and st[part].shape == got.shape and _err(got, st[part], scale) <= within:
                return f"equals the unsharded state after token {t - 1}, not after token {a - 1}" if t else \
                    "equals the call's entering state: no predecessor's summary was applied"
    if stage == "entry_state" and i > 1:
        summ = {}
        for r, w in enumerate(ranks):
            for n in w:
                if n.startswith("segments.") and n.endswith(".M"):
                    j = int(n.split(".")[1])
                    summ[j] = (np.asarray(w[n]), np.asarray(w[f"segments.{j}.U"]))
        if all(j in summ for j in range(i)):
            s = states[0][1]
            for j in reversed(range(i)):
                s = summ[j][0] @ s + summ[j][1]
            if _err(got, s, scale) <= within:
                return "equals its predecessors' summaries composed in reverse token order"
    return ""


def judge_tpcp(cfg: GDNConfig, plan: TPCPPlan, ranks: list[dict], trace: dict, states: list, *, bound,
               weights, nmse_bound=None, measured: dict | None = None) -> tuple[list[ShardFailure], int]:
    """Judge a tensor × context-parallel run of one call: ``ranks[r]`` what rank r wrote
    (``segments.{i}.{halo, M, U, entry_state, attn_out_partial, attn_out}``), ``trace`` the unsharded call's
    ``core_gated`` and ``attn_out`` ([B, T, ...]), ``states[t]`` the unsharded ``(conv_state, recurrent_state)``
    after the call's first t tokens (at every segment boundary), ``weights`` the layer's (``out_proj``). Each
    rank's segment is judged on its share: the halo at its conv channels, the entry state and the summary at its
    value heads, its partial (its heads' ``core_gated`` times its ``out_proj`` columns, on the segment's tokens)
    and the reduced output on those tokens, each by the scale of the whole tensor. A rank that wrote a segment
    its CP rank does not own, or a share of another shape (other heads or tokens), fails. ``measured`` (keyed
    ``(segment, stage)``) as :func:`judge_tp`'s."""
    failures, judged = [], 0
    w_out = np.asarray(weights[OUT], dtype=np.float64)
    for r, written in enumerate(ranks):
        own = [i for i, (c, _, _) in enumerate(plan.cp.segments) if c == plan.cp_rank(r)]
        extra = sorted({int(n.split(".")[1]) for n in written if n.startswith("segments.")
                        and n.split(".")[1].isdecimal()} - set(own))
        if extra:
            failures.append(ShardFailure(r, extra[0], "attn_out", float("inf"), f"rank {r} wrote segments {extra} its "
                                         f"CP rank {plan.cp_rank(r)} does not own (its segments: {own})"))
    for i, (c, a, b) in enumerate(plan.cp.segments):
        where = f"segment {i} (tokens {_range(a, b)})"
        for stage in TPCP_STAGES:
            b_elem, b_nmse = _bound_of(bound, stage), _bound_of(nmse_bound, stage)
            shares = {u: _tpcp_share(cfg, plan.tp.shares[u], stage, i, a, b, trace, states, w_out)
                      for u in range(plan.tp.world)}
            for t in range(plan.tp.world):
                r = plan.rank_of(t, c)
                share = plan.tp.shares[t]
                want, whole, what = shares[t]
                seg = {n.split(".", 2)[2]: np.asarray(v) for n, v in ranks[r].items()
                       if n.startswith(f"segments.{i}.")}
                judged += 1
                if stage == "summary":
                    entry = states[a][1][:, share.v_start:share.v_stop]
                    got = None if "M" not in seg or "U" not in seg else seg["U"] if (
                        np.shape(seg["M"]) != entry.shape[:-1] + entry.shape[-2:-1] or seg["U"].shape != entry.shape) \
                        else seg["M"] @ entry + seg["U"]  # a share of other heads: judged (and said) by its shape
                else:
                    got = seg.get(stage)
                what = f"{what}, tp rank {t} of cp rank {c}"
                if got is None:
                    failures.append(ShardFailure(r, i, stage, float("inf"), f"rank {r}, {where}, {stage} ({what}): "
                                                 f"missing, but every rank must write it"))
                    continue
                e = _err(got, want, _scale(whole))
                n = _nmse(got, want, whole) if nmse_bound is not None else 0.0
                figures = _measured(r, e, b_elem, n, nmse_bound is not None and b_nmse, stage, what, "whole_scale")
                if measured is not None:
                    measured.setdefault((i, stage), []).append(figures)
                if e > b_elem or n > b_nmse:
                    within = _equals_within(e, b_elem)
                    fact = _tpcp_fact(cfg, plan, t, stage, i, np.asarray(got), seg, shares, states, ranks, a,
                                      _scale(whole), within)
                    failures.append(ShardFailure(r, i, stage, max(e / b_elem, n / b_nmse), _message(
                        r, where, stage, what, got, want, e, b_elem, fact, n, nmse_bound is not None and b_nmse),
                        figures))
    order = list(TPCP_STAGES)
    failures.sort(key=lambda f: (f.where, order.index(f.stage), f.rank))
    return failures, judged


def _tpcp_share(cfg, share, stage, i, a, b, trace, states, w_out):
    """(the golden share, the whole golden tensor, what the share is) of a stage of segment i on a TP share."""
    v = slice(share.v_start, share.v_stop)
    heads = f"value heads {_range(share.v_start, share.v_stop)}"
    if stage == "halo":
        return (states[a][0][:, share.conv_channels(cfg)], states[a][0],
                f"conv channels of key heads {_range(share.k_start, share.k_stop)}, {heads}")
    if stage == "entry_state":
        return states[a][1][:, v], states[a][1], heads
    if stage == "summary":
        return states[b][1][:, v], states[b][1], heads
    if stage == "attn_out":
        return trace["attn_out"][:, a:b], trace["attn_out"], "the output reduced over its TP group"
    cg = trace["core_gated"][:, a:b, v]
    return (cg.reshape(*cg.shape[:-2], -1) @ w_out[:, share.value_channels(cfg)].T, trace["attn_out"],
            f"the out_proj partial of {heads}")


def _tpcp_fact(cfg, plan, t, stage, i, got, seg, shares, states, ranks, a, scale, within) -> str:
    """What TP rank ``t``'s failing share of segment ``i`` equals instead, where it does: its own partial or twice
    the reduced output (``attn_out``), another TP rank's share, and the context-parallel facts on its heads."""
    scale = max(scale, 1e-300)

    def close(x) -> bool:
        return x is not None and np.shape(x) == np.shape(got) and _err(got, np.asarray(x, np.float64), scale) <= within

    if stage == "attn_out":
        if close(seg.get("attn_out_partial")):
            return "equals its own out_proj partial: the all-reduce did not run"
        if close(2 * shares[t][0]):
            return "equals 2× the reduced output: reduced twice"
        return ""
    for u, (want, _, _) in shares.items():
        if u != t and close(want):
            other = plan.tp.shares[u]
            return f"equals TP rank {u}'s share (value heads {_range(other.v_start, other.v_stop)})"
    share = plan.tp.shares[t]
    if stage in ("halo", "entry_state"):  # the context-parallel facts, on the share's channels and heads
        ch, v = share.conv_channels(cfg), slice(share.v_start, share.v_stop)
        sliced = [None if st is None else (st[0][:, ch], st[1][:, v]) for st in states]
        return _cp_fact(plan.cp, i, stage, got, sliced, [ranks[m] for m in plan.cp_group(t)], a, scale, within)
    return "is zero everywhere" if not np.any(got) else ""


def _measured(rank: int, e: float, bound: float, nmse: float, nmse_bound, tensor: str, share: str,
              rule: str) -> dict:
    """A rank's errors and bounds on one tensor, for its record (the kill matrix's margin, the report's rank
    figures): ``tensor`` the rank's tensor judged, ``share`` what it holds, ``rule`` what ``max_err`` is of
    (``whole_scale``, ``log_decay``, ``relative``); an error is inf where the tensor holds NaN or is of another
    shape than the share."""
    return {"rank": rank, "max_err": e, "nmse": nmse if nmse_bound else 0.0, "elem_bound": bound,
            "nmse_bound": float(nmse_bound or 0.0), "tensor": tensor, "share": share, "rule": rule}


def _message(rank, where, stage, what, got, want, e, bound, fact, nmse=0.0, nmse_bound=None, rule=None) -> str:
    if np.shape(got) != np.shape(want):
        size = f"shape {list(np.shape(got))}, but its share's is {list(np.shape(want))}"
    elif not np.isfinite(e):
        size = "NaN or infinity"
    else:
        of = f" {rule}" if rule else " of the whole tensor's scale"
        size = f"max error {e:.2e}{of}, {e / bound:.3g}× the bound {bound:g}"
        if nmse_bound:
            size += f"; NMSE {nmse:.2e}, {nmse / nmse_bound:.3g}× the bound {nmse_bound:.3g}"
    return f"rank {rank}, {where}, {stage} ({what}): {size}" + (f"; {fact}" if fact else "")
