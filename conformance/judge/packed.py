"""Judging a serving step (FORMAT.md §4.1): where a packed call's failure sits.

A packed call's stage tensors are ``[total_tokens, ...]``: they are judged as one row of
``total_tokens`` tokens (``[1, total_tokens, ...]``, so the per-token groups of :mod:`.metrics` are
the same; the case-wide groups span every packed token of the case). A failure is then reported by
sequence and by token within it (:func:`locate_token`). Its states are the whole pool ``[S, ...]``:
a failure names the slots over the bound and whether the step was allowed to write them
(:func:`slot_note`) — a slot the step does not name that differs from the golden was written by it
(a state written to the wrong slot, a padding sequence's state stored), one it names that differs
was written wrong or not at all.

The split of a packed stream into its sequences lives here once (:func:`sequences`,
:func:`sequence_of`): the judge's messages and the report's per-sequence sections
(``reports/packed.py``) both go through it, and :func:`layout` is what the summary keeps of a
serving step so that the report can split without the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gdncheck.calls import PAD_SLOT_ID
from gdncheck.harness import is_packed
from gdncheck.stages import STATE_NAMES

from . import messages, symptoms
from .metrics import CaseStats, error_denominator, scaled_error
from .records import Record
from .tolerances import Bound


def as_judged(arr: np.ndarray, step: dict, name: str) -> np.ndarray:
    """A tensor of a call as the judge sees it: a packed step's stage tensor [total_tokens, ...] as one
    row [1, total_tokens, ...]; anything else (a pool state too) unchanged. The judge and the tolerance
    derivation both go through this, so bounds are earned on what is judged."""
    return arr[None] if is_packed(step) and name not in STATE_NAMES else arr


@dataclass(frozen=True)
class Sequence:
    """Sequence ``index`` of a packed call: stream tokens ``[start, stop)``, its pool slot, its seq_pos."""

    index: int
    slot: int
    start: int
    stop: int
    seq_pos: int

    @property
    def length(self) -> int:
        return self.stop - self.start

    @property
    def padding(self) -> bool:
        return self.slot == PAD_SLOT_ID

    @property
    def kind(self) -> str:
        """``decode`` (one token) or ``prefill`` (more), as an engine schedules them."""
        return "decode" if self.length == 1 else "prefill"

    @property
    def slot_text(self) -> str:
        return "the padding slot" if self.padding else f"slot {self.slot}"


def sequences(step: dict) -> list[Sequence]:
    """The sequences of a serving step with a packed stream (``cu_seqlens``); none for a ``commit``."""
    if "cu_seqlens" not in step:
        return []
    cu = [int(c) for c in step["cu_seqlens"]]
    return [Sequence(i, int(step["slots"][i]), cu[i], cu[i + 1], int(step["seq_pos"][i])) for i in range(len(cu) - 1)]


def sequence_of(step: dict, t: int) -> tuple[Sequence, int]:
    """The sequence holding stream token ``t`` and the token's index within it."""
    seqs = sequences(step)
    i = int(np.searchsorted([s.start for s in seqs], t, side="right") - 1)
    return seqs[i], t - seqs[i].start


def is_verify_row(step: dict, index: int) -> bool:
    """Whether sequence ``index`` of a step is a speculative-verify row: every row of a ``verify_spec``,
    the rows flagged ``verify`` of a ``forward_mixed``."""
    if step["op"] == "forward_mixed":
        return bool(step["verify"][index])
    return step["op"] == "verify_spec"


def token_word(step: dict, index: int = 0) -> str:
    """What a token of sequence ``index`` is in this step: a speculative verify's tokens are draft tokens."""
    return "draft token" if is_verify_row(step, index) else "token"


#: the fields of a serving step the summary keeps (:func:`layout`), besides op, call and the slots it may write
LAYOUT_FIELDS = ("cu_seqlens", "seq_pos", "slots", "accepted", "of_call", "snap_seq", "snap_offset", "snap_slot",
                 "verify")


def layout(index: int, step: dict) -> dict:
    """What the summary keeps of serving step ``index`` (the case's ``serving`` list, docs/verify.md):
    enough to split its tensors by sequence and its pool by slot without the manifest."""
    out = {"step": index, "op": step["op"], "call": step["call"]}
    out.update({k: [int(v) for v in step[k]] if isinstance(step[k], list) else int(step[k])
                for k in LAYOUT_FIELDS if k in step})
    out["writes"] = sorted(written_slots(step))
    return out


def written_slots(step: dict) -> set[int]:
    """The slots a serving step may write: its sequences' (a verify: none; a mixed call: its plain rows';
    a commit: those accepting at least one token) and its snapshots' destinations."""
    slots = [s for i, s in enumerate(step.get("slots", [])) if s != PAD_SLOT_ID and not is_verify_row(step, i)]
    if step["op"] == "commit":
        slots = [s for s, n in zip(step["slots"], step["accepted"]) if s != PAD_SLOT_ID and n > 0]
    return set(slots) | set(step.get("snap_slot", []))


def locate_token(rec: Record, step: dict) -> None:
    """Turn a packed record's first bad token (an index into the stream) into (sequence, token of
    it, its position) and say so in the message."""
    if rec.first_bad_token is None:
        return
    t = rec.first_bad_token
    seq, j = sequence_of(step, t)
    rec.first_bad_row, rec.first_bad_token = seq.index, j
    rec.first_bad_position = seq.seq_pos + j
    where = "the padding sequence" if seq.padding else f"slot {seq.slot}"
    # the failure said its first element as if the stream were one row at sequence 0's position
    word = token_word(step, seq.index)
    messages.relocate(rec, f"sequence {seq.index}'s {word} {j} (position {rec.first_bad_position})",
                      f"[packed call: stream token {t} is sequence {seq.index} ({where}, {seq.length} tokens), "
                      f"its {word} {j} at position {rec.first_bad_position}]")


def slot_note(rec: Record, step: dict, actual: np.ndarray | None, expected: np.ndarray, bound: Bound,
              stats: CaseStats | None, before: np.ndarray | None = None) -> None:
    """For a failing pool state: the slots over the bound, and which of them the step may not write.
    ``before``: the port's pool before the step, when known; a slot over the bound that the step may
    not write but left as it was is carried from an earlier step, not touched by this one."""
    if rec.verdict != "fail" or actual is None or tuple(np.shape(actual)) != tuple(expected.shape):
        return
    err = scaled_error(actual, expected, rec.tensor, bound.profile, stats)
    bad = [s for s in range(err.shape[0]) if not (err[s] <= bound.elem).all()]
    if not bad:
        return
    rec.first_bad_row = bad[0]
    allowed = written_slots(step)
    unchanged = set()
    if before is not None and tuple(before.shape) == tuple(np.shape(actual)):
        unchanged = {s for s in bad if np.array_equal(before[s], actual[s], equal_nan=True)}
    roles = symptoms.slot_roles(step)
    role = {"own": f"this {step['op']}'s own", "snapshot": "a snapshot destination",
            "kept": "kept as it was by this step", "verify": "a verify row's, not written by the call"}
    wrong = [s for s in bad if s not in allowed and s not in unchanged]
    carried = [s for s in bad if s not in allowed and s in unchanged]
    note = f"[pool slots over the bound: {bad}"
    if wrong:
        note += f"; slot(s) {wrong} are not written by this {step['op']}: it touched a slot it must not"
    if carried:
        note += f"; slot(s) {carried} are left as they were: wrong since an earlier step"
    for s in bad:  # a slot this step writes: its role, and whether it was written at all
        if s in allowed:
            what = "left unchanged, but this step should write it" if s in unchanged else "written wrong"
            note += f"; slot {s} ({role.get(roles.get(s, ''), 'written by this step')}): {what}"
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    d = np.broadcast_to(error_denominator(e, rec.tensor, bound.profile, stats), e.shape)
    facts = [f for f in symptoms.equals_pool(a, e, d, bound.elem, bad, step, {"after": e})
             if "left unchanged" not in f.text]
    if facts:
        note += "; " + "; ".join(f.text for f in facts)
    note += "]"
    messages.add_note(rec, note)
