"""Judging one call of a case's program, by its kind.

:func:`call_judge` picks the judge of a call step from what the step is:

- :class:`PlainCall` — a ``forward`` or ``decode`` call: each stage tensor the golden keeps, in the
  step's order, against its bound; then (end to end) the rows' ``seq_len``.
- :class:`RoutedCall` — a call of a sparse layer (it keeps ``selected_experts``): the routing verdict
  first, on sets of experts per token (routing.py); at an exact tie the float64 expectations for the
  port's own experts (ties.py); ``routing_weights`` compared by expert; then as a plain call.
- :class:`PackedCall` — a serving call (``forward_packed``, ``prefix_snapshots``, ``verify_spec``): its
  packed layout recorded, its stage tensors judged as one row of ``total_tokens`` (packed.as_judged),
  a failure located by sequence and token, or by pool slot (packed.py); then as a plain call.

Each judge builds its records one way (:func:`tensor_record`, :func:`seq_len_record`) and appends them
to the case's report; the case judge (case.py) walks the program and calls :meth:`CallJudge.judge`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from gdncheck.fixtures.coverage import coverage_of
from gdncheck.harness import CALL_OPS, call_key, is_packed
from gdncheck.stages import STATE_NAMES, STATE_STAGE, STATE_STAGE_INDEX

from . import messages, packed
from .aliases import NamedOutputs
from .metrics import CaseStats
from .records import CaseReport, Record
from .routing import RoutingCheck, judge_routing
from .ties import tie_expectations
from .tolerances import ToleranceTable
from .verdicts import allowed_dtypes, base_record, judge


class CaseJudge(Protocol):
    """What a call's judge reads of the case judge that hands itself in (case.CaseJudge)."""

    fixtures: Path
    entry: dict
    profile: str
    table: ToleranceTable
    stage_isolated: bool
    report: CaseReport
    gold: object  # the golden case file (SafetensorsFile)
    outs: NamedOutputs
    stats: dict[str, CaseStats]

    @property
    def case(self) -> str: ...

    @property
    def mode(self) -> str: ...

    @property
    def bound_mode(self) -> str: ...

#: The dtypes a seq_len output may have (FORMAT.md §7: I32 or I64).
SEQ_LEN_DTYPES = ("I64", "I32")
#: The dtypes an index tensor (``selected_experts``) may be written in: any that holds the indices
#: exactly (FORMAT.md §5; the routing verdict refuses values that are not indices).
INDEX_DTYPES = ("I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "F64", "F32", "F16", "BF16")


def read_checked(outs: NamedOutputs, key: str, shape: tuple[int, ...], allowed: tuple[str, ...]
                 ) -> tuple[np.ndarray | None, str | None]:
    """(the array, its stored dtype), (None, None) when absent. Its dtype and shape are checked against
    what the golden expects *before* anything is read: a tensor of another dtype or shape comes back as
    a zero-cost stand-in of its declared shape (a broadcast view of nothing), which the verdict fails on
    its dtype or shape without a byte of it being read or allocated."""
    if key not in outs:
        return None, None
    dtype, declared = outs.dtype_of(key), outs.shape_of(key, shape)
    if dtype in allowed and tuple(declared) == tuple(shape):
        return outs.read(key, shape), dtype
    try:
        return np.broadcast_to(np.zeros((), np.float32), declared), dtype
    except ValueError:  # a declared size beyond the address space: only its shape is ever looked at
        return _Declared(tuple(declared)), dtype


@dataclass(frozen=True)
class _Declared:
    """A tensor known by its declared shape only."""

    shape: tuple[int, ...]


def golden_ref(cj: CaseJudge, key: str | None) -> dict:
    """Where a record's expected tensor lies: the case file and its key."""
    return {"file": str(Path(cj.fixtures) / cj.entry["file"]), "key": key}


def tensor_record(cj: CaseJudge, i: int, step: dict, name: str) -> Record:
    """The record of stage tensor ``name`` of call step ``i`` before it is judged (verdict pass)."""
    key = call_key(step["call"], name)
    return base_record(cj.case, i, step["op"], step["call"], name, seq_pos=list(step["seq_pos"]),
                       expected_ref=golden_ref(cj, key), actual_ref=cj.outs.ref(cj.report.outputs_file, key))


def seq_len_record(cj: CaseJudge, i: int, step: dict, **fields) -> Record:
    """The record of the rows' ``seq_len`` after call step ``i`` (``fields``: verdict, dtype, ...)."""
    return Record(case=cj.case, step=i, op=step["op"], call=step["call"], tensor="seq_len", stage=STATE_STAGE,
                  stage_index=STATE_STAGE_INDEX, expected_shape=[len(step["seq_len_after"])], **fields)


class PlainCall:
    """A ``forward`` or ``decode`` call (module docstring); the other kinds override its hooks."""

    kind = "plain"

    def __init__(self, cj: CaseJudge, i: int, step: dict):
        self.cj, self.i, self.step = cj, i, step
        self.where = messages.Where(cj.case, i, step["op"], step["seq_pos"])
        self.required = () if cj.stage_isolated else tuple(coverage_of(cj.entry)["required"])

    def judge(self) -> None:
        """Every tensor the golden keeps for this call, then (end to end) its seq_len."""
        self.begin()
        for name in self.step["expected"]:
            self.cj.report.records.append(self.judge_tensor(name))
        if not self.cj.stage_isolated:
            self.judge_seq_len()

    # --- the hooks of a kind -------------------------------------------------------------------------
    def begin(self) -> None:
        """What the call needs judged or noted before its tensors."""

    def expectation(self, name: str, expected: np.ndarray) -> np.ndarray:
        """The float64 expectation of tensor ``name`` (the golden's, unless the kind knows better)."""
        return expected

    def compared(self, name: str, actual, expected):
        """(actual, expected) as the verdict compares them."""
        return actual, expected

    def locate(self, rec: Record, name: str, actual, expected, bound) -> None:
        """What a kind adds to a judged record (where a failure is)."""

    # --- one tensor, one seq_len ---------------------------------------------------------------------
    def judge_tensor(self, name: str) -> Record:
        cj, step, k = self.cj, self.step, self.step["call"]
        key = call_key(k, name)
        actual, dtype = read_checked(cj.outs, key, cj.gold.shape_of(key), allowed_dtypes(name, cj.profile)[0])
        rec = tensor_record(cj, self.i, step, name)
        expected = self.expectation(name, cj.gold.read(key))
        bound = cj.table.bound(name, cj.profile, cj.bound_mode, cj.case)
        actual, expected = self.compared(name, actual, expected)
        judge(rec, actual, dtype, expected, bound, required=name in self.required,
              subject=messages.Subject(name, rec.stage, k), where=self.where, stats=cj.stats.get(name))
        self.locate(rec, name, actual, expected, bound)
        return rec

    def judge_seq_len(self) -> None:
        cj, step = self.cj, self.step
        key = call_key(step["call"], "seq_len")
        n = len(step["seq_len_after"])
        actual, dtype = read_checked(cj.outs, key, (n,), SEQ_LEN_DTYPES)
        if actual is None:  # optional (FORMAT.md §7), but counted as not provided, as any tensor is
            cj.report.records.append(seq_len_record(cj, self.i, step, verdict="missing"))
            return
        rec = seq_len_record(cj, self.i, step, verdict="pass", dtype=dtype, shape=list(actual.shape),
                             actual_ref={"file": cj.report.outputs_file, "key": key})
        usable = dtype in SEQ_LEN_DTYPES and tuple(actual.shape) == (n,)
        found = np.asarray(actual).ravel().tolist() if usable else f"of dtype {dtype} and shape {list(actual.shape)}"
        if not usable or found != list(step["seq_len_after"]):
            messages.fail(rec, "seq_len", messages.seq_len_failure(
                subject=f"seq_len after call {step['call']}", actual=found, expected=step["seq_len_after"],
                where=self.where))
        cj.report.records.append(rec)


class RoutedCall(PlainCall):
    """A sparse layer's call: the routing verdict first (module docstring)."""

    kind = "routed"
    routing: RoutingCheck
    ties: dict[str, np.ndarray]

    def begin(self) -> None:
        super().begin()
        cj, step, k = self.cj, self.step, self.step["call"]
        name = "selected_experts"
        key = call_key(k, name)
        actual, dtype = read_checked(cj.outs, key, cj.gold.shape_of(key), INDEX_DTYPES)
        rec = tensor_record(cj, self.i, step, name)
        self.routing = judge_routing(rec, actual, dtype, cj.gold.read(key), cj.gold.read(call_key(k, "router_logits")),
                                     subject=messages.Subject(name, rec.stage, k), where=self.where,
                                     normalised=cj.entry["config"].get("norm_topk_prob", True) is not False)
        self.ties = {}
        if self.routing.any_tied and not is_packed(step):
            cj.report.notes.append(f"call {k}: {self.routing.record.convention['text']}")
            if not cj.stage_isolated:  # stage-isolated, each stage after the routing gets the golden routing
                self.ties = tie_expectations(cj.gold, k, cj.entry["config"], self.routing)

    def judge_tensor(self, name: str) -> Record:
        if name == "selected_experts":
            return self.routing.record
        return super().judge_tensor(name)

    def expectation(self, name: str, expected: np.ndarray) -> np.ndarray:
        # at a tie, the float64 expectation for the port's own experts (ties.py)
        return self.ties.get(name, super().expectation(name, expected))

    def compared(self, name: str, actual, expected):
        actual, expected = super().compared(name, actual, expected)
        if name == "routing_weights":  # by expert, on the tokens routed alike
            actual, expected = self.routing.weights(actual, expected)
        return actual, expected


class PackedCall(PlainCall):
    """A serving call over pool slots (module docstring)."""

    kind = "packed"

    def begin(self) -> None:
        self.cj.report.serving.append(packed.layout(self.i, self.step))
        super().begin()

    def compared(self, name: str, actual, expected):
        actual, expected = super().compared(name, actual, expected)
        if actual is not None:
            actual = packed.as_judged(actual, self.step, name)
        return actual, packed.as_judged(expected, self.step, name)

    def locate(self, rec: Record, name: str, actual, expected, bound) -> None:
        super().locate(rec, name, actual, expected, bound)
        if name in STATE_NAMES:  # a pool state: the slots over the bound, and whether the step may write them
            before = self.pool_before(name, expected.shape) if rec.verdict == "fail" else None
            packed.slot_note(rec, self.step, actual, expected, bound, self.cj.stats.get(name), before=before)
        else:  # a stage tensor of the stream: the sequence and token of the failure
            packed.locate_token(rec, self.step)

    def pool_before(self, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
        """The port's pool state ``name`` before this step: what it wrote at the step before when that
        step is a call keeping it (another step between, a ``free``, changes the pool unrecorded)."""
        cj, i = self.cj, self.i
        if i == 0:
            return None
        prev = cj.entry["program"][i - 1]
        if prev["op"] not in CALL_OPS or name not in prev["expected"]:
            return None
        arr, _ = read_checked(cj.outs, call_key(prev["call"], name), tuple(shape),
                              allowed_dtypes(name, cj.profile)[0])
        return arr if isinstance(arr, np.ndarray) and arr.shape == tuple(shape) else None


class PackedRoutedCall(PackedCall, RoutedCall):
    """A serving call of a sparse layer: the routing verdict, then the packed call's judging."""

    kind = "packed, routed"


def call_judge(cj: CaseJudge, i: int, step: dict) -> PlainCall:
    """The judge of call step ``i`` by its kind: packed (a serving call), routed (it keeps
    ``selected_experts``), both, or plain."""
    routed = "selected_experts" in step["expected"]
    if is_packed(step):
        return (PackedRoutedCall if routed else PackedCall)(cj, i, step)
    return (RoutedCall if routed else PlainCall)(cj, i, step)
