"""Comparisons of the property suite, judged exactly as `verify` judges a fixture case.

A generated configuration is no fixture recipe, so its bound is the tolerance table's `properties`
row for the profile (the envelope over every recipe and a stratified sample of `.draws`). Calls are
judged like a case's calls: the scales of the case-wide groups and the NMSE's normaliser come from
every call of the program together (`gdncheck.conformance.judge.metrics.CaseStats`). The NMSE bound
is judged only on a call's tensor of at least `MIN_NMSE_ELEMENTS` elements, and `a` and `b` are
not judged (what they feed, `g` and `beta`, is).

Why each rule, with the measurements: docs/tolerances.md §3 (item 6).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from gdncheck.conformance.judge.metrics import case_stats
from gdncheck.conformance.judge.tolerances import Bound, load_table
from gdncheck.conformance.judge.verdicts import base_record, judge
from gdncheck.harness import END_TO_END
from gdncheck.stages import REQUIRED_OUTPUTS, STAGE_NAMES, STATE_NAMES, stage_index, stage_of, tensor_rank

REQUIRED = REQUIRED_OUTPUTS
MIN_NMSE_ELEMENTS = 256
#: The eps of the gated norm's conditions (metrics.gated_norm_conditions): the smallest eps the
#: strategies draw, whose conditions are the largest (the comparison does not see the config).
GATED_NORM_EPS = 1e-6


NOT_JUDGED = ("a", "b")


def bounded_tensors(profile: str) -> set[str]:
    return set(load_table().data["modes"][END_TO_END][profile]["global"]) - set(NOT_JUDGED)


def compare_calls(actual: Sequence[dict], expected: Sequence[dict], profile: str, what: str, *,
                  tensors: Iterable[str] | None = None, required: Iterable[str] = REQUIRED) -> list[str]:
    """Failure messages (empty when every tensor of every call is within its bound).

    ``actual`` and ``expected``: one dict per call, tensor name -> array. A tensor the implementation
    does not return is not judged, unless it is ``required``.
    """
    names = set(tensors) if tensors is not None else bounded_tensors(profile)
    failures: list[str] = []
    goldens = {n: {k: e[n] for k, e in enumerate(expected) if e.get(n) is not None}
               for n in names | {"core"} if n not in STATE_NAMES}
    all_stats = case_stats({n: v for n, v in goldens.items() if v}, GATED_NORM_EPS)
    for name in sorted(names, key=_order):
        exp = [e.get(name) for e in expected]
        if any(e is None for e in exp):
            continue
        acts = [a.get(name) for a in actual]
        if any(a is None for a in acts):
            if name in required:
                failures.append(f"{name}: not returned by the implementation, but should be [{what}]")
            continue
        stats = None if name in STATE_NAMES else all_stats.get(name)
        for k, (a, e) in enumerate(zip(acts, exp)):
            bound = property_bound(name, profile, np.size(e))
            rec = base_record("property", k, "forward", k, name, actual_ref={"file": "-", "key": name})
            judge(rec, np.asarray(a), "F64", np.asarray(e), bound, required=True,
                  subject=f"{name} of call {k}", where=f"[{what}]", stats=stats)
            if rec.verdict == "fail":
                failures.append(rec.message)
                break  # the first failing call of a tensor is enough
    return failures


def property_bound(name: str, profile: str, size: int) -> Bound:
    """The table's bound of a generated layer (its ``properties`` row: the envelope over every recipe and
    the derivation's sample of these draws); its NMSE part only for tensors of at least MIN_NMSE_ELEMENTS."""
    b = load_table().property_bound(name, profile)
    if size >= MIN_NMSE_ELEMENTS:
        return b
    return Bound(b.tensor, b.profile, b.mode, b.elem, float("inf"), f"{b.source} (elementwise only: {size} elements)")


def assert_close(actual: Sequence[dict], expected: Sequence[dict], profile: str, what: str, **kw) -> None:
    failures = compare_calls(actual, expected, profile, what, **kw)
    if failures:
        more = f"\n(and {len(failures) - 3} more tensors)" if len(failures) > 3 else ""
        raise AssertionError("\n".join(failures[:3]) + more)


def assert_identical(actual: dict, expected: dict, what: str) -> None:
    """Bit-identical arrays (the snapshot promises): name the first differing tensor in pipeline
    order (the stage that produced the difference, not the alphabetically first), and its first
    differing element."""
    for name in sorted(set(actual) & set(expected), key=_order):
        a, e = np.asarray(actual[name]), np.asarray(expected[name])
        if a.shape != e.shape:
            raise AssertionError(f"{name}: shape {list(a.shape)}, but should be {list(e.shape)} as before [{what}]")
        diff = ~((a == e) | (np.isnan(a) & np.isnan(e)))
        if diff.any():
            idx = tuple(int(i) for i in np.argwhere(diff)[0])
            raise AssertionError(f"{name}: {int(diff.sum())} / {a.size} elements differ, first at {list(idx)}: "
                                 f"{a[idx]!r}, but should be bit-identical to {e[idx]!r} [{what}]")


def concat_calls(calls: Sequence[dict], names: Iterable[str] | None = None) -> dict:
    """One dict of the stage tensors of consecutive calls joined along the token axis, and the state
    after the last call."""
    out = {}
    keys = set(calls[0]) if names is None else set(names)
    for name in keys:
        if not all(name in c for c in calls):
            continue
        if name in STATE_NAMES or name == "seq_len":
            out[name] = calls[-1][name]
        else:
            out[name] = np.concatenate([c[name] for c in calls], axis=1)
    return out


def _order(name: str) -> tuple:
    """Pipeline order: the stage's index (docs/spec.md §2), then the tensor's place in its stage;
    names outside the vocabulary (seq_len) last."""
    try:
        return (stage_index(stage_of(name)), tensor_rank(name), name)
    except (KeyError, ValueError):
        return (len(STAGE_NAMES), 0, name)
