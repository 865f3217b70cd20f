"""The routing verdict of a sparse (MoE) layer, judged before the numbers.

Routing is discontinuous, so verify asks first, per call, whether the port selected the reference's
experts *as a set* per token; a token routed otherwise fails the call's `selected_experts` record
with reason `routing` (the token, both expert sets, the reference's margin). A set that differs only
among experts exactly tied with the k-th is a convention: it passes, recorded as
`Record.convention`, and the tensors after it are judged for the port's own set
(conformance/judge/ties.py). `routing_weights` is judged by expert on the tokens routed alike.

Why and the messages: docs/moe.md, "Verify: the routing verdict" and "Ties".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .messages import Subject, Where
from .records import Record

#: How many disagreeing tokens a record lists (the count is always complete).
LISTED = 10


@dataclass
class RoutingCheck:
    """One call's routing: the record for ``selected_experts`` and which tokens were routed alike."""

    record: Record
    alike: np.ndarray | None  # [B, T] bool; None where the port wrote no usable selected_experts
    actual_order: np.ndarray | None = None  # [B, T, k]: the port's slots sorted by expert
    gold_order: np.ndarray | None = None  # [B, T, k]: the golden's
    tied: np.ndarray | None = None  # [B, T] bool: routed otherwise, consistently with the exact ordering
    actual_sets: np.ndarray | None = None  # [B, T, k] int64: the port's experts, sorted by index
    probs: np.ndarray | None = None  # [B, T, E] float64: softmax of the golden router_logits
    normalised: bool = True  # norm_topk_prob: the routing weights renormalised over the top k

    @property
    def any_tied(self) -> bool:
        return self.tied is not None and bool(self.tied.any())

    def weights(self, actual: np.ndarray | None, expected: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """``routing_weights`` (port's, golden's) by expert, the tokens routed otherwise given the
        golden's values (so they count neither way: the routing record holds them)."""
        if self.alike is None or actual is None or np.shape(actual) != np.shape(expected):
            return actual, expected
        a = np.take_along_axis(np.asarray(actual, dtype=np.float64), self.actual_order, -1)
        e = np.take_along_axis(np.asarray(expected, dtype=np.float64), self.gold_order, -1)
        if self.any_tied:  # the port's own experts' weights, from the golden probabilities (float64)
            p = np.take_along_axis(self.probs, self.actual_sets, -1)
            if self.normalised:
                p = p / p.sum(axis=-1, keepdims=True)
            e = np.where(self.tied[..., None], p, e)
        return np.where(self.alike[..., None], a, e), e


def probability_margins(router_logits: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """[..., T] each: p_(k) − p_(k+1) and l_(k) − l_(k+1), the gaps at the k boundary (float64)."""
    l = np.asarray(router_logits, dtype=np.float64)
    if top_k >= l.shape[-1]:
        inf = np.full(l.shape[:-1], np.inf)
        return inf, inf.copy()
    p = np.exp(l - l.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    lt = -np.sort(-l, axis=-1)[..., top_k - 1: top_k + 1]
    pt = -np.sort(-p, axis=-1)[..., top_k - 1: top_k + 1]
    return pt[..., 0] - pt[..., 1], lt[..., 0] - lt[..., 1]


def tie_consistent(router_logits: np.ndarray, actual_sets: np.ndarray, expected_sets: np.ndarray) -> np.ndarray:
    """[B, T] bool: the port's set holds the same multiset of float64 logits as the reference's, i.e. it
    differs (if at all) only among experts exactly tied with the k-th: a choice the exact ordering
    allows. ``*_sets``: [B, T, k] expert indices."""
    l = np.asarray(router_logits, dtype=np.float64)
    la = np.sort(np.take_along_axis(l, actual_sets, -1), axis=-1)
    le = np.sort(np.take_along_axis(l, expected_sets, -1), axis=-1)
    return np.all(la == le, axis=-1)


def tie_choice(actual_only: list[int], expected_only: list[int]) -> str:
    """How a port resolved one tie: ``lower index`` (the reference's rule), ``higher index`` (every
    expert it took above every one it left), or ``other``."""
    if not actual_only:
        return "lower index"
    if min(actual_only) > max(expected_only):
        return "higher index"
    return "other"


def judge_routing(rec: Record, actual: np.ndarray | None, dtype: str | None, expected: np.ndarray,
                  router_logits: np.ndarray, *, subject: Subject | str, where: Where | str,
                  normalised: bool = True) -> RoutingCheck:
    """Fill ``rec`` (the call's ``selected_experts``) and say which tokens were routed alike, and which
    otherwise but consistently with the exact ordering (a tie's convention, module docstring)."""
    rec.expected_shape = list(np.shape(expected))
    if actual is None:
        rec.verdict = "missing"
        return RoutingCheck(rec, None)
    rec.dtype, rec.shape = dtype, list(np.shape(actual))
    E = np.shape(router_logits)[-1]
    a = np.asarray(actual, dtype=np.float64)
    if tuple(a.shape) != tuple(np.shape(expected)):
        return _invalid(rec, "shape", f"{subject}: shape {list(a.shape)}, expected {rec.expected_shape} "
                                      f"([B, T, top_k]) {where}")
    if not np.all(np.isfinite(a)) or np.any(a != np.round(a)) or np.any(a < 0) or np.any(a >= E):
        return _invalid(rec, "routing", f"routing: {subject} holds values that are not expert indices in "
                                        f"[0, {E}) {where}")
    a = a.astype(np.int64)
    e = np.asarray(expected, dtype=np.float64).astype(np.int64)
    a_sorted, e_sorted = np.sort(a, axis=-1), np.sort(e, axis=-1)
    if a.shape[-1] > 1 and np.any(a_sorted[..., 1:] == a_sorted[..., :-1]):
        return _invalid(rec, "routing", f"routing: {subject} selects an expert twice for one token {where}")
    same = np.all(a_sorted == e_sorted, axis=-1)
    tied = ~same & tie_consistent(router_logits, a_sorted, e_sorted)
    alike = same | tied
    check = RoutingCheck(rec, alike, np.argsort(a, axis=-1, kind="stable"), np.argsort(e, axis=-1, kind="stable"),
                         tied=tied, actual_sets=a_sorted, normalised=normalised)
    if tied.any():
        lg = np.asarray(router_logits, dtype=np.float64)
        p = np.exp(lg - lg.max(axis=-1, keepdims=True))
        check.probs = p / p.sum(axis=-1, keepdims=True)
        rec.convention = tie_convention(a_sorted, e_sorted, tied, rec.seq_pos)
    bad = np.argwhere(~alike)  # [n, 2]: (row, token), row-major: the first token of the first row first
    if not len(bad):
        return check
    pm, lm = probability_margins(router_logits, a.shape[-1])
    tokens = []
    for row, t in bad[:LISTED]:
        only_a = sorted(set(a[row, t].tolist()) - set(e[row, t].tolist()))
        only_e = sorted(set(e[row, t].tolist()) - set(a[row, t].tolist()))
        pos = (rec.seq_pos[row] + int(t)) if rec.seq_pos else int(t)
        tokens.append({"row": int(row), "token": int(t), "position": int(pos),
                       "expected": e_sorted[row, t].tolist(), "actual": a_sorted[row, t].tolist(),
                       "only_expected": only_e, "only_actual": only_a,
                       "prob_margin": float(pm[row, t]), "logit_margin": float(lm[row, t]),
                       "exact_tie": bool(lm[row, t] == 0.0)})
    rec.routing = {"tokens_routed_otherwise": int(len(bad)), "tokens": int(alike.size), "first": tokens}
    rec.first_bad_row, rec.first_bad_token = tokens[0]["row"], tokens[0]["token"]
    rec.first_bad_position = tokens[0]["position"]
    rec.over_bound = int(len(bad))
    rec.verdict, rec.reason = "fail", "routing"
    rec.message = routing_message(subject, tokens[0], len(bad), int(alike.size), where)
    return check


def tie_convention(a_sorted: np.ndarray, e_sorted: np.ndarray, tied: np.ndarray, seq_pos: list[int] | None) -> dict:
    """``Record.convention`` of a call whose port resolved exact ties otherwise than the reference."""
    choices, first = {}, []
    for row, t in np.argwhere(tied):
        only_a = sorted(set(a_sorted[row, t].tolist()) - set(e_sorted[row, t].tolist()))
        only_e = sorted(set(e_sorted[row, t].tolist()) - set(a_sorted[row, t].tolist()))
        choice = tie_choice(only_a, only_e)
        choices[choice] = choices.get(choice, 0) + 1
        if len(first) < LISTED:
            pos = (seq_pos[row] + int(t)) if seq_pos else int(t)
            first.append({"row": int(row), "token": int(t), "position": int(pos), "actual": a_sorted[row, t].tolist(),
                          "expected": e_sorted[row, t].tolist()})
    choice = next(iter(choices)) if len(choices) == 1 else "mixed"
    return {"kind": "routing_tie", "tokens": int(tied.sum()), "choice": choice, "choices": choices, "first": first,
            "text": (f"exact ties on the k boundary at {int(tied.sum())} token(s) resolved to the {choice} "
                     f"(the reference: the lower index); a convention, not a deviation: the tensors after the "
                     f"routing are judged against float64 for the port's own experts (docs/moe.md, Ties)")}


def routing_message(subject: Subject | str, tok: dict, n: int, total: int, where: Where | str) -> str:
    """One line: which token, which experts, the reference's margin there, and what it means."""
    head = (f"routing: {subject}: {n} of {total} token(s) routed to other experts; first token {tok['token']} "
            f"(position {tok['position']}, row {tok['row']}): the port chose {tok['actual']}, the reference "
            f"{tok['expected']} (only the port's: {tok['only_actual']}, only the reference's: {tok['only_expected']})")
    if tok["exact_tie"]:
        why = ("an exact tie at the k boundary (the k-th and (k+1)-th probabilities are equal), but the port's "
               "set is not one the exact ordering allows: it takes an expert below the tie or leaves one above "
               "it (any of the tied experts would do; docs/moe.md, Ties)")
    else:
        why = (f"the reference's k-th and (k+1)-th probabilities differ by {tok['prob_margin']:.3g} (logit gap "
               f"{tok['logit_margin']:.3g}), more than any profile's rounding can close (the fixtures keep every "
               "token so): the port routes wrongly")
    return f"{head}; {why} {where}"


def _invalid(rec: Record, reason: str, message: str) -> RoutingCheck:
    rec.verdict, rec.reason, rec.message = "fail", reason, message
    return RoutingCheck(rec, None)
