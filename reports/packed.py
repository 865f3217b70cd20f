"""A serving case on its page (docs/serving.md): a packed call split by sequence, its pool by slot.

A packed call's stage tensors are one stream of ``total_tokens`` tokens; the judge reads them as one
row ``[1, total_tokens, ...]`` (``conformance/judge/packed.py``, :func:`as_judged`). The page shows
them per sequence instead: each sequence's slot, length, seq_pos and kind (prefill or decode), its
largest error against the bound and its own token axis (token 0 = the sequence's first token; a
speculative verify's tokens are its draft tokens). A pool state ``[S, ...]`` is shown per slot:
whether the step may write it, the padding slot, and a slot over the bound that the step must not
write, flagged. The split itself is the judge's (:func:`~gdncheck.conformance.judge.packed.sequences`,
:func:`~gdncheck.conformance.judge.packed.written_slots`): this module only lays it out, from the
summary's ``serving`` layouts (docs/verify.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gdncheck.calls import PAD_SLOT_ID
from gdncheck.conformance.judge.packed import (
    Sequence,
    as_judged,
    is_verify_row,
    sequence_of,
    sequences,
    token_word,
)
from gdncheck.stages import STATE_NAMES

#: sequences drawn (as panels of one figure) for one failing tensor at most, those over the bound
#: first: a call of many sequences keeps its page within the report's size budget
#: (tests/reports/test_size.py) and each panel wide enough to read
MAX_SEQUENCE_PLOTS = 6
#: what the pool table says of a slot the step does not name
UNNAMED = "not named: must stay as it was"


def layouts(case_raw: dict) -> dict[int, dict]:
    """Step index -> the layout verify kept of that serving step (none for a dense case)."""
    return {int(lay["step"]): lay for lay in case_raw.get("serving") or []}


def is_stream(layout: dict | None, tensor: str) -> bool:
    """A tensor packed by token (``[total_tokens, ...]``) in this step, rather than the pool's state."""
    return layout is not None and "cu_seqlens" in layout and tensor not in STATE_NAMES


def judged_shape(layout: dict | None, tensor: str, shape: list | None) -> list | None:
    """The shape a file holds for a tensor verify judged as ``shape`` (a stream: without the leading 1)."""
    return shape[1:] if is_stream(layout, tensor) and shape and shape[0] == 1 else shape


def as_seen(arr: np.ndarray, layout: dict | None, tensor: str) -> np.ndarray:
    """A tensor read from a file as the judge saw it (:func:`as_judged`): a stream as one row."""
    return as_judged(arr, layout, tensor) if layout is not None else arr


def where(layout: dict, row: int | None, token: int | None) -> str:
    """``sequence 1, token 0 (slot 0)`` for a stream position (a verify's: ``draft token``)."""
    seq = sequences(layout)[row]
    return f"sequence {seq.index}, {token_word(layout, seq.index)} {token} ({seq.slot_text})"


def first_text(fd, layout: dict) -> str:
    """A first divergence in a serving step: the call, stage and tensor, then the sequence, its token
    and slot (a stage tensor) or the first pool slot over the bound (a state)."""
    parts = [f"call {fd.call}" if fd.call is not None else f"step {fd.step} ({fd.op})"]
    parts += [f"{k} {v}" for k, v in (("stage", fd.stage), ("tensor", fd.tensor)) if v]
    if fd.tensor and is_stream(layout, fd.tensor) and fd.row is not None and fd.token is not None:
        parts.append(where(layout, fd.row, fd.token) + (f", position {fd.position}" if fd.position is not None else ""))
    elif fd.tensor in STATE_NAMES and fd.row is not None:
        role = slot_roles(layout).get(fd.row)
        parts.append(f"pool slot {fd.row} ({role or UNNAMED})")
    if fd.reason and not fd.tensor:
        parts.append(fd.reason.replace("_", " "))
    return ", ".join(parts)


def step_label(layout: dict) -> str:
    """The pipeline's row label of a serving step: what it does, in the step's own terms."""
    op, call = layout["op"], layout["call"]
    if op == "commit":
        snaps = f", {len(layout['snap_offset'])} snapshots" if layout.get("snap_offset") else ""
        return f"call {call} (commit of call {layout.get('of_call')}: accepted {layout.get('accepted')}{snaps})"
    seqs = sequences(layout)
    n = sum(s.length for s in seqs)
    extra = f", {len(layout.get('snap_offset', []))} snapshots" if op == "prefix_snapshots" else ""
    return f"call {call} ({op}: {len(seqs)} sequences, {n} tokens{extra})"


def meanings(layout: dict) -> list[dict]:
    """One row per sequence (a commit: per sequence committed; snapshots: per snapshot too) saying
    what the step does with it: its slot, tokens, positions, and the step's meaning for it."""
    op = layout["op"]
    rows = []
    if op == "commit":
        for i, (slot, n) in enumerate(zip(layout["slots"], layout["accepted"])):
            what = (f"commit {n}: the slot's state after the first {n} draft token{'s' if n != 1 else ''} of call "
                    f"{layout.get('of_call')}"
                    if n else "commit 0: the slot keeps its state from before the verify")
            if "verify" in layout and not layout["verify"][i]:  # a plain row of a mixed call
                what = f"plain row of call {layout.get('of_call')}: written by that call, nothing to commit"
            rows.append(_row(i, slot, None, layout["seq_pos"][i], None, what if slot != PAD_SLOT_ID else
                             "padding: nothing committed"))
        return rows + _snapshot_rows(layout, "accepted tokens")
    for seq in sequences(layout):
        if seq.padding:
            what = "padding: computed from a zero state, no pool slot read or written"
        elif is_verify_row(layout, seq.index):
            what = (f"verify {seq.length} draft tokens (draft token 0 … {seq.length - 1}); the slot is not written "
                    f"until a commit")
        else:
            what = f"{seq.kind}: reads and writes its slot"
        kind = "verify" if is_verify_row(layout, seq.index) else seq.kind  # draft tokens, neither prefill nor decode
        rows.append(_row(seq.index, seq.slot, seq.length, seq.seq_pos, kind, what))
    return rows + _snapshot_rows(layout, "tokens")


def _snapshot_rows(layout: dict, counted: str) -> list[dict]:
    return [{"sequence": s, "slot": f"slot {d}", "tokens": None, "positions": None, "kind": "snapshot",
             "what": f"snapshot at offset {o}: the state of sequence {s} after its first {o} {counted}, "
                     f"stored in slot {d}"}
            for s, o, d in zip(layout.get("snap_seq", []), layout.get("snap_offset", []), layout.get("snap_slot", []))]


def _row(i: int, slot: int, length: int | None, pos: int, kind: str | None, what: str) -> dict:
    return {"sequence": i, "slot": "padding (−1)" if slot == PAD_SLOT_ID else f"slot {slot}", "tokens": length,
            "positions": (f"{pos} … {pos + length - 1}" if length else "—") if length is not None else str(pos),
            "kind": kind, "what": what}


@dataclass
class SequenceError:
    """One sequence of a failing stream tensor: its largest error and first token over the bound."""

    seq: Sequence
    word: str  # token or draft token
    max_err: float
    ratio: float | None
    first_bad: int | None  # index within the sequence
    over: int  # tokens over the bound
    plot: str | None = None  # path of its per-token plot, relative to the page

    @property
    def label(self) -> str:
        return f"sequence {self.seq.index}"

    @property
    def first_position(self) -> int | None:
        return None if self.first_bad is None else self.seq.seq_pos + self.first_bad


def per_token(err: np.ndarray) -> np.ndarray:
    """The largest error of each token of a ``[1, tokens, ...]`` error (NaN counts as inf)."""
    e = np.where(np.isnan(err), np.inf, err)
    return e.reshape(e.shape[0], e.shape[1], -1).max(axis=(0, 2)) if e.shape[1] else np.zeros(0)


def split_sequences(err: np.ndarray, layout: dict, bound: float) -> list[SequenceError]:
    """Each sequence's errors from a stream tensor's error ``[1, total_tokens, ...]``."""
    rows = []
    for seq in sequences(layout):
        per = per_token(err[:, seq.start:seq.stop])
        over = np.flatnonzero(~(per <= bound))
        worst = float(per.max()) if per.size else 0.0
        rows.append(SequenceError(seq, token_word(layout), worst, worst / bound if bound else None,
                                  int(over[0]) if over.size else None, int(over.size)))
    return rows


def plotted_sequences(rows: list[SequenceError]) -> list[SequenceError]:
    """The sequences that get a per-token plot: more than one token, those over the bound first."""
    multi = [r for r in rows if r.seq.length > 1]
    chosen = sorted(multi, key=lambda r: (r.first_bad is None, r.seq.index))[:MAX_SEQUENCE_PLOTS]
    return sorted(chosen, key=lambda r: r.seq.index)


@dataclass
class SlotError:
    """One slot of a failing pool state: what the step may do with it and its largest error."""

    slot: int
    role: str
    may_write: bool
    max_err: float
    ratio: float | None
    over: bool
    touched: bool | None = None  # did the port's step change the slot (None: no pool before it to compare)

    @property
    def carried(self) -> bool:
        """Over the bound in a slot the step must not write and left as the port had it: wrong since an
        earlier step, not this one's doing."""
        return self.over and not self.may_write and self.touched is False

    @property
    def unwritten(self) -> bool:
        """Over the bound in a slot the step should write, and left as it was: the write did not happen."""
        return self.over and self.may_write and self.touched is False

    @property
    def shown(self) -> bool:
        """A row of its own: named by the step, or over the bound (the others are listed in one line)."""
        return self.over or self.role != UNNAMED

    @property
    def flagged(self) -> bool:
        """Over the bound in a slot the step must not write, and changed by it (or not known unchanged)."""
        return self.over and not self.may_write and self.touched is not False


def slot_roles(layout: dict) -> dict[int, str]:
    """What the step does with each slot it names."""
    roles: dict[int, list[str]] = {}
    op = layout["op"]
    for i, slot in enumerate(layout["slots"]):
        if slot == PAD_SLOT_ID:
            continue
        if op != "commit" and is_verify_row(layout, i):
            text = f"sequence {i}'s: read (verify writes no slot)"
        elif op == "commit":
            n = layout["accepted"][i]
            text = f"sequence {i}'s: commit {n}" + ("" if n else " (left as it was)")
        else:
            text = f"sequence {i}'s: read and written"
        roles.setdefault(slot, []).append(text)
    for s, o, d in zip(layout.get("snap_seq", []), layout.get("snap_offset", []), layout.get("snap_slot", [])):
        roles.setdefault(d, []).append(f"snapshot of sequence {s} at offset {o}")
    return {k: "; ".join(v) for k, v in roles.items()}


def split_slots(err: np.ndarray, layout: dict, bound: float, before: np.ndarray | None = None,
                after: np.ndarray | None = None) -> list[SlotError]:
    """Each pool slot's errors from a state's error ``[S, ...]``. ``before`` / ``after``: the port's
    pool before the step (its previous step's, when nothing came between) and after it; a slot they
    hold equal was not touched by the step, so an error in it was carried from an earlier one."""
    roles = slot_roles(layout)
    writes = set(layout.get("writes", []))
    compare = before is not None and after is not None and before.shape == after.shape == err.shape
    out = []
    for s in range(err.shape[0]):
        e = np.where(np.isnan(err[s]), np.inf, err[s])
        worst = float(e.max()) if e.size else 0.0
        touched = (not np.array_equal(before[s], after[s], equal_nan=True)) if compare else None
        out.append(SlotError(s, roles.get(s, UNNAMED), s in writes, worst,
                             worst / bound if bound else None, not worst <= bound, touched))
    return out


def previous_pool(records: list[dict], rec: dict) -> dict | None:
    """The record of the same pool state written by the program step just before ``rec``'s (none when
    another step came between — a ``free`` or ``reset`` changes the pool without a record — or
    ``rec``'s is the first call)."""
    return next((r for r in records if r["tensor"] == rec["tensor"] and r["step"] == rec["step"] - 1
                 and r.get("call") is not None and r["op"] != "save"), None)


def locate_worst(rows: list[dict], layout: dict) -> None:
    """Worst-element rows of a stream tensor re-indexed ``[sequence, token, ...]`` with their positions."""
    for w in rows:
        seq = sequence_of(layout, w["index"][1])[0]
        j = w["index"][1] - seq.start
        w["index"] = [seq.index, j, *w["index"][2:]]
        w["position"] = seq.seq_pos + j
