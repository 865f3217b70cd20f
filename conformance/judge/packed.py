"""Judging a serving step (FORMAT.md §4.1): where a packed call's failure sits.

A packed call's stage tensors are ``[total_tokens, ...]``: they are judged as one row of
``total_tokens`` tokens (``[1, total_tokens, ...]``, so the per-token groups of :mod:`.metrics` are
the same; the case-wide groups span every packed token of the case). A failure is then reported by
sequence and by token within it (:func:`locate_token`). Its states are the whole pool ``[S, ...]``:
a failure names the slots over the bound and whether the step was allowed to write them
(:func:`slot_note`) — a slot the step does not name that differs from the golden was written by it
(a state written to the wrong slot, a padding sequence's state stored), one it names that differs
was written wrong or not at all.
"""

from __future__ import annotations

import numpy as np

from gdncheck.calls import PAD_SLOT_ID
from gdncheck.harness import is_packed
from gdncheck.stages import STATE_NAMES

from .metrics import CaseStats, scaled_error
from .records import Record
from .tolerances import Bound


def as_judged(arr: np.ndarray, step: dict, name: str) -> np.ndarray:
    """A tensor of a call as the judge sees it: a packed step's stage tensor [total_tokens, ...] as one
    row [1, total_tokens, ...]; anything else (a pool state too) unchanged. The judge and the tolerance
    derivation both go through this, so bounds are earned on what is judged."""
    return arr[None] if is_packed(step) and name not in STATE_NAMES else arr


def written_slots(step: dict) -> set[int]:
    """The slots a serving step may write: its sequences' (a verify: none; a commit: those accepting
    at least one token) and its snapshots' destinations."""
    slots = [s for s in step.get("slots", []) if s != PAD_SLOT_ID]
    if step["op"] == "verify_spec":
        return set()
    if step["op"] == "commit":
        return {s for s, n in zip(step["slots"], step["accepted"]) if s != PAD_SLOT_ID and n > 0}
    return set(slots) | set(step.get("snap_slot", []))


def locate_token(rec: Record, step: dict) -> None:
    """Turn a packed record's first bad token (an index into the stream) into (sequence, token of
    it, its position) and say so in the message."""
    if rec.first_bad_token is None:
        return
    cu = np.asarray(step["cu_seqlens"])
    t = rec.first_bad_token
    i = int(np.searchsorted(cu, t, side="right") - 1)
    j = t - int(cu[i])
    slot = step["slots"][i]
    rec.first_bad_row, rec.first_bad_token = i, j
    rec.first_bad_position = int(step["seq_pos"][i]) + j
    if rec.message:
        where = "the padding sequence" if slot == PAD_SLOT_ID else f"slot {slot}"
        rec.message += (f" [packed call: stream token {t} is sequence {i} ({where}, {int(cu[i + 1] - cu[i])} "
                        f"tokens), its token {j} at position {rec.first_bad_position}]")


def slot_note(rec: Record, step: dict, actual: np.ndarray | None, expected: np.ndarray, bound: Bound,
              stats: CaseStats | None) -> None:
    """For a failing pool state: the slots over the bound, and which of them the step may not write."""
    if rec.verdict != "fail" or actual is None or tuple(np.shape(actual)) != tuple(expected.shape):
        return
    err = scaled_error(actual, expected, rec.tensor, bound.profile, stats)
    bad = [s for s in range(err.shape[0]) if not (err[s] <= bound.elem).all()]
    if not bad:
        return
    rec.first_bad_row = bad[0]
    allowed = written_slots(step)
    wrong = [s for s in bad if s not in allowed]
    note = f" [pool slots over the bound: {bad}"
    if wrong:
        note += f"; slot(s) {wrong} are not written by this {step['op']}: it touched a slot it must not]"
    else:
        note += "; each is one this step writes: its state is wrong]"
    rec.message = (rec.message or "") + note
