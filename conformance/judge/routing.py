"""The routing verdict of a sparse (MoE) layer, judged before the numbers (docs/moe.md, "Verify").

Routing is discontinuous, so a port that selects other experts for a token is not "a little off": it
computed another function there, and every tensor after the routing stage differs at that token by
far more than any bound. Verify therefore asks first, per call, whether the port selected the
reference's experts, *as a set* per token (the order of the k slots is the order of the
probabilities, which two correct ports may round differently where two are nearly equal; nothing
downstream depends on it but a summation order). A token routed otherwise fails the call's
``selected_experts`` record with reason ``routing`` and a message naming the token, both expert sets
and the reference's probability margin there (p_(k) − p_(k+1), and the logit gap): the fixtures keep
every token's margin beyond any profile's rounding (fixtures/moe_cases.py), so a flip is a bug, except
at an exact tie, which the reference resolves to the lower expert index and every port must too.

``routing_weights`` is then judged by expert (each token's slots sorted by expert index) on the
tokens routed alike; a token routed otherwise is left out of it (its weights belong to other
experts), and its downstream tensors fail as they must, after the routing record in pipeline order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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

    def weights(self, actual: np.ndarray | None, expected: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """``routing_weights`` (port's, golden's) by expert, the tokens routed otherwise given the
        golden's values (so they count neither way: the routing record holds them)."""
        if self.alike is None or actual is None or np.shape(actual) != np.shape(expected):
            return actual, expected
        a = np.take_along_axis(np.asarray(actual, dtype=np.float64), self.actual_order, -1)
        e = np.take_along_axis(np.asarray(expected, dtype=np.float64), self.gold_order, -1)
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


def judge_routing(rec: Record, actual: np.ndarray | None, dtype: str | None, expected: np.ndarray,
                  router_logits: np.ndarray, *, subject: str, loc: str) -> RoutingCheck:
    """Fill ``rec`` (the call's ``selected_experts``) and say which tokens were routed alike."""
    rec.expected_shape = list(np.shape(expected))
    if actual is None:
        rec.verdict = "missing"
        return RoutingCheck(rec, None)
    rec.dtype, rec.shape = dtype, list(np.shape(actual))
    E = np.shape(router_logits)[-1]
    a = np.asarray(actual, dtype=np.float64)
    if tuple(a.shape) != tuple(np.shape(expected)):
        return _invalid(rec, "shape", f"{subject}: shape {list(a.shape)}, expected {rec.expected_shape} "
                                      f"([B, T, top_k]) {loc}")
    if not np.all(np.isfinite(a)) or np.any(a != np.round(a)) or np.any(a < 0) or np.any(a >= E):
        return _invalid(rec, "routing", f"routing: {subject} holds values that are not expert indices in "
                                        f"[0, {E}) {loc}")
    a = a.astype(np.int64)
    e = np.asarray(expected, dtype=np.float64).astype(np.int64)
    a_sorted, e_sorted = np.sort(a, axis=-1), np.sort(e, axis=-1)
    if a.shape[-1] > 1 and np.any(a_sorted[..., 1:] == a_sorted[..., :-1]):
        return _invalid(rec, "routing", f"routing: {subject} selects an expert twice for one token {loc}")
    alike = np.all(a_sorted == e_sorted, axis=-1)
    check = RoutingCheck(rec, alike, np.argsort(a, axis=-1, kind="stable"), np.argsort(e, axis=-1, kind="stable"))
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
    rec.message = routing_message(subject, tokens[0], len(bad), int(alike.size), loc)
    return check


def routing_message(subject: str, tok: dict, n: int, total: int, loc: str) -> str:
    """One line: which token, which experts, the reference's margin there, and what it means."""
    head = (f"routing: {subject}: {n} of {total} token(s) routed to other experts; first token {tok['token']} "
            f"(position {tok['position']}, row {tok['row']}): the port chose {tok['actual']}, the reference "
            f"{tok['expected']} (only the port's: {tok['only_actual']}, only the reference's: {tok['only_expected']})")
    if tok["exact_tie"]:
        why = ("an exact tie at the k boundary (the k-th and (k+1)-th probabilities are equal): the reference "
               "takes the lower expert index, as CUDA torch.topk and a stable sort do, and every port must "
               "(docs/moe.md, Ties)")
    else:
        why = (f"the reference's k-th and (k+1)-th probabilities differ by {tok['prob_margin']:.3g} (logit gap "
               f"{tok['logit_margin']:.3g}), more than any profile's rounding can close (the fixtures keep every "
               "token so): the port routes wrongly")
    return f"{head}; {why} {loc}"


def _invalid(rec: Record, reason: str, message: str) -> RoutingCheck:
    rec.verdict, rec.reason, rec.message = "fail", reason, message
    return RoutingCheck(rec, None)
