"""The report's view of a verify summary: cases, records and the cases × stages grid, as plain data.

Nothing here reads tensors or renders anything: :func:`load_summary` parses and checks the summary
(a path or the parsed dict of ``conformance/judge/summary.schema.json``), :func:`build` turns it into the
view objects the templates show. A record's view *is* the judge's record read back
(:meth:`~gdncheck.conformance.judge.records.Record.from_json`: the non-finite strings ``"inf"``,
``"-inf"``, ``"nan"`` become floats again) with what the page adds; a case's first divergence is the
judge's :class:`~gdncheck.conformance.judge.records.FirstDivergence`, printed its one way. Every
number shown comes from the summary unchanged (the engine's metrics).
"""

from __future__ import annotations

import copy
import hashlib
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from gdncheck.conformance.judge.records import (
    SUMMARY_SCHEMA,
    SUMMARY_SCHEMA_VERSION,
    FirstDivergence,
    Record,
    validate_summary,
)
from gdncheck.errors import GDNError
from gdncheck.stages import PIPELINE_ORDER, STAGE_NAMES, TENSOR_BY_NAME, tensor_rank
from gdncheck.untrusted import read_json, safe_text

from . import packed


class ReportInputError(GDNError):
    """A summary the report cannot read (not JSON, another schema or version, a broken record)."""

    code = "report_input"


#: Grid columns: every stage verify judges (``input`` is given, never compared), then the state
#: bookkeeping (``seq_len``, stage ``state``).
GRID_STAGES: tuple[str, ...] = tuple(STAGE_NAMES[1:]) + ("state",)
#: A sparse layer's block stages, placed in pipeline order where a summary holds them.
MOE_GRID_STAGES: tuple[str, ...] = tuple(s for s in PIPELINE_ORDER if s not in STAGE_NAMES)
VERDICT_ORDER = {"fail": 0, "missing": 1, "pass": 2}
#: failure reasons that leave nothing to plot (no values, or values of the wrong shape)
NO_VALUES = ("missing_required", "dtype", "shape")
#: a summary larger than this is refused unread (the default suite's is a few MB; a file this large
#: takes the report minutes and gigabytes)
MAX_SUMMARY_BYTES = 64 << 20


#: the most points of a record's per-token profile the report reads (verify writes 64): a longer one, which
#: no verify wrote, is max-pooled to this many before anything else reads it (2 million points took the
#: report 202 s and 300 MB)
MAX_PROFILE_POINTS = 1024


def bound_profiles(doc: dict) -> int:
    """Max-pool each record's ``token_profile`` longer than :data:`MAX_PROFILE_POINTS` (each bucket's first
    token and largest error: no peak, inf or NaN lost); how many were. A long profile that is no two lists of
    one length, of integers and numbers, is a :class:`ReportInputError` (one line) before the schema check,
    which would take minutes over it."""
    import numpy as np

    from .plots import max_pooled

    pooled = 0
    cases = doc.get("cases") if isinstance(doc.get("cases"), list) else []
    for c in cases:
        records = c.get("records") if isinstance(c, dict) and isinstance(c.get("records"), list) else []
        for i, r in enumerate(records):
            tp = r.get("token_profile") if isinstance(r, dict) else None
            if not isinstance(tp, dict):
                continue
            tok, val = tp.get("token"), tp.get("max_err")
            if not (isinstance(tok, list) and isinstance(val, list)) or max(len(tok), len(val)) <= MAX_PROFILE_POINTS:
                continue
            where = f"case {safe_text(str(c.get('id')))[:80]!r}, record {i}"
            if len(tok) != len(val):
                raise ReportInputError(f"expected a token_profile of one token per value ({where}), found "
                                       f"{len(tok)} tokens and {len(val)} values")
            if not all(type(t) is int for t in tok) or not all(
                    type(v) in (int, float) or v in ("inf", "-inf", "nan") for v in val):
                raise ReportInputError(f"expected a token_profile of integer tokens and numbers ({where}), found "
                                       "other values")
            t, v = max_pooled(np.asarray(tok, dtype=np.int64), np.asarray([float(x) for x in val]),
                              MAX_PROFILE_POINTS)
            r["token_profile"] = {"token": [int(x) for x in t],
                                  "max_err": [float(x) if np.isfinite(x) else str(x) for x in v]}
            pooled += 1
    return pooled


class CheckedSummary(dict):
    """A summary :func:`load_summary` has checked; passing it back in skips the check."""


def load_summary(summary: str | Path | dict) -> CheckedSummary:
    """The summary as a dict (a deep copy when given one), checked: schema name, version, structure."""
    if isinstance(summary, CheckedSummary):
        return summary
    if isinstance(summary, dict):
        doc = copy.deepcopy(summary)
    else:
        path = Path(summary)
        doc = read_json(path, what="verify summary", error=ReportInputError, max_bytes=MAX_SUMMARY_BYTES,
                        missing=f"no summary file {path}: write one with `gdncheck verify ... --summary {path}`")
    if not isinstance(doc, dict) or doc.get("schema") != SUMMARY_SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise ReportInputError(f"expected a summary of schema {SUMMARY_SCHEMA!r} (gdncheck verify --summary), "
                               f"found {found!r}")
    if doc.get("schema_version") != SUMMARY_SCHEMA_VERSION:
        raise ReportInputError(f"expected summary schema_version {SUMMARY_SCHEMA_VERSION}, found "
                               f"{doc.get('schema_version')!r}: use the gdncheck that wrote it")
    import jsonschema  # deferred: only a summary that needs checking pays for it

    from .checks import checked_repros, refuse_contradictions, refuse_duplicate_ids

    refuse_duplicate_ids(doc, ReportInputError)  # before the schema check, minutes on a large file
    bound_profiles(doc)  # so is a profile of millions of points
    try:
        validate_summary(doc)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top)"
        raise ReportInputError(f"the summary breaks its schema at {where}: {exc.message}") from None
    refuse_contradictions(doc, ReportInputError)  # the headline never better than its cases
    checked_repros(doc)  # a repro line shown only as gdncheck writes one
    return CheckedSummary(doc)


def slug(text: str, taken: set[str]) -> str:
    """A file-name-safe, unique stem for ``text`` (case ids are safe already and stay as they are)."""
    base = re.sub(r"[^A-Za-z0-9._-]", "_", text)[:80].strip("._") or "case"
    name = base if base == text else f"{base}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"
    while name.lower() in taken:
        name = f"{name}-{hashlib.sha1(name.encode()).hexdigest()[:4]}"
    taken.add(name.lower())
    return name


@dataclass(kw_only=True)
class RecordView(Record):
    """One record (case, call, tensor) as the case page shows it: the judge's record, and the page's additions."""

    anchor: str
    raw: dict  # the record as the summary holds it (for the tensor loader)
    first: bool = False  # the case's first divergence
    featured: bool = False  # plotted: the first divergence or one of the worst (assets.featured)
    plots: dict = field(default_factory=dict)  # kind -> a PNG's path relative to the case page, or inline SVG
    captions: dict[str, str] = field(default_factory=dict)  # kind -> extra caption text
    heat: dict | None = None  # heatmap layout (assets.heat_layout)
    blocks: list | None = None  # (head or segment, elements over the bound, elements)
    notes: list[str] = field(default_factory=list)
    worst: list[dict] = field(default_factory=list)  # top-k rows
    worst_axes: list[str] = field(default_factory=list)
    sequences: list = field(default_factory=list)  # a packed stream's packed.SequenceError per sequence
    slots: list = field(default_factory=list)  # a serving step's pool state: packed.SlotError per slot
    serving: dict | None = None  # the layout of the record's serving step (packed.layouts)

    @property
    def port_key(self) -> str | None:
        """The port's own name of the tensor, when verify read it through a name table (``--names``)."""
        ref = self.raw.get("actual_ref")
        key = ref.get("port_key") if isinstance(ref, dict) else None
        return safe_text(key) if isinstance(key, str) else None

    @property
    def sectioned(self) -> bool:
        """A failing record with a section of its own: plotted, without values (its message says why),
        or split by sequence or slot; every other failing record is its row in the metrics table."""
        return self.verdict == "fail" and (self.featured or self.metrics is None or self.reason in NO_VALUES
                                           or bool(self.slots) or bool(self.sequences))

    @property
    def link(self) -> str:
        """Where the page shows this record best: its section, else its metrics row."""
        return self.anchor if self.sectioned else f"t-{self.anchor}"

    @property
    def seq_plots(self) -> list:
        """The sequences drawn in the per-sequence figure (a panel each), in sequence order."""
        return [q for q in self.sequences if q.plot]

    @property
    def first_where(self) -> str | None:
        """A packed stream's first token over the bound: ``sequence s, token t (slot k)``."""
        if self.serving is None or self.first_bad_row is None or self.first_bad_token is None \
                or not packed.is_stream(self.serving, self.tensor):
            return None
        return packed.where(self.serving, self.first_bad_row, self.first_bad_token)

    @property
    def blocks_over(self) -> list | None:
        """The heads (segments) with elements over the bound, when only some have."""
        if not self.blocks:
            return None
        over = [b for b in self.blocks if b[1]]
        return over if over and len(over) < len(self.blocks) else None

    @property
    def is_state(self) -> bool:
        """A state tensor (or anything else that is no stage tensor of a call's trace)."""
        return self.tensor not in TENSOR_BY_NAME

    @property
    def where(self) -> str:
        if self.op == "save":
            return "saved snapshot" + (f" (state of call {self.call})" if self.call is not None else " (zero state)")
        return f"call {self.call}"

    @property
    def rank_figures(self) -> dict | None:
        """A sharded record's rank figures (the judge's ``shard``, docs/sharding.md): the rank, the rank's tensor
        judged and what it holds, its error and NMSE with their bounds and ratios, and, on a passing record, of
        how many ranks it is the worst; None for any other record. Numbers as the summary holds them."""
        s = self.shard if isinstance(self.shard, dict) else None
        if s is None:
            return None

        def ratio(v, b):
            return v / b if isinstance(v, int | float) and isinstance(b, int | float) and b > 0 else None

        rule = s.get("rule")
        return {"rank": s.get("rank"), "tensor": s.get("tensor") or self.tensor, "share": s.get("share"),
                "of_ranks": s.get("of_ranks"), "max_err": s.get("max_err"), "elem_bound": s.get("elem_bound"),
                "elem_ratio": ratio(s.get("max_err"), s.get("elem_bound")),
                "nmse": s.get("nmse") if s.get("nmse_bound") else None, "nmse_bound": s.get("nmse_bound") or None,
                "nmse_ratio": ratio(s.get("nmse"), s.get("nmse_bound")),
                "rule": {"log_decay": "log decay", "relative": "relative"}.get(rule, "of the whole tensor's scale")}

    @property
    def rank_text(self) -> str | None:
        """``rank 0`` (a failing rank's record), ``rank 1, worst of 3`` (a passing stage's), or None."""
        f = self.rank_figures
        if f is None or f["rank"] is None:
            return None
        worst = f", worst of {f['of_ranks']}" if self.verdict == "pass" and (f["of_ranks"] or 0) > 1 else ""
        return f"rank {f['rank']}{worst}"

    @property
    def elem_ratio(self) -> float | None:
        """How many times the elementwise bound the largest scaled error is."""
        if not self.metrics or not self.bound or not self.bound.get("elem"):
            return None
        return self.metrics["max_err"] / self.bound["elem"]

    @property
    def nmse_ratio(self) -> float | None:
        if not self.metrics or not self.bound or not self.bound.get("nmse"):
            return None
        return self.metrics["nmse"] / self.bound["nmse"]


@dataclass
class StepView:
    """One row of the case page's pipeline: a call (forward/decode) or a saved snapshot."""

    step: int
    op: str
    call: int | None
    seq_pos: list | None
    records: list[RecordView]
    cells: dict[str, str]  # grid stage -> worst verdict
    first_stage: str | None
    serving: dict | None = None  # a serving step's layout (packed.layouts)

    @property
    def seq_records(self) -> list[RecordView]:
        """The step's failing stream tensors split by sequence (a column each in its sequence table)."""
        return [r for r in self.records if r.sequences]

    @property
    def meanings(self) -> list[dict]:
        """A serving step's sequences (snapshots, commits) and what the step does with each."""
        return packed.meanings(self.serving) if self.serving else []

    @property
    def label(self) -> str:
        if self.serving is not None:
            return packed.step_label(self.serving)
        if self.op == "save":
            return f"step {self.step}: save" + (f" (state of call {self.call})" if self.call is not None else "")
        pos = f", seq_pos {self.seq_pos}" if self.seq_pos is not None else ""
        return f"call {self.call} ({self.op}{pos})"

    @property
    def failed(self) -> int:
        return sum(r.verdict == "fail" for r in self.records)


@dataclass
class CaseView:
    raw: dict
    id: str
    page: str  # file stem of the case page
    kind: str
    tags: list[str]
    status: str
    steps: list[StepView]
    records: list[RecordView]
    cells: dict[str, str]
    cell_calls: dict[str, tuple[int, int]]  # stage -> (failing records, judged records)
    first: FirstDivergence | None
    serving: dict[int, dict] = field(default_factory=dict)  # step -> layout of a serving step

    @property
    def sharded(self) -> bool:
        """A sharded case (its records judged rank by rank): its metrics tables show each rank's figures."""
        return any(r.reason == "sharded" or r.shard is not None for r in self.records)

    @property
    def first_record(self) -> RecordView | None:
        return next((r for r in self.records if r.first), None)

    @property
    def failing(self) -> list[RecordView]:
        """Failing records, the first divergence first, then in program and pipeline order."""
        fails = [r for r in self.records if r.verdict == "fail"]
        return sorted(fails, key=lambda r: (not r.first, r.step, r.stage_index, tensor_rank(r.tensor)))

    @property
    def plotted(self) -> list[RecordView]:
        """The featured records (plots), the first divergence first."""
        return [r for r in self.failing if r.featured]

    @property
    def unplotted(self) -> list[RecordView]:
        """Failing records with a section but no plots (no values; a serving step's split)."""
        return [r for r in self.failing if r.sectioned and not r.featured]

    @property
    def rows_only(self) -> int:
        """Failing records shown as their metrics row alone."""
        return sum(not r.sectioned for r in self.failing)

    @property
    def diagnosis(self) -> dict | None:
        """The likely cause as the summary holds it, every field present (None where that diagnosis
        state has none: a skipped or failed diagnosis names no candidate), so that a page reads any
        state verify can write."""
        d = self.raw.get("diagnosis")
        if not isinstance(d, dict):
            return None
        keys = ("verdict", "text", "tensor", "call", "candidate", "source", "residual")
        return {k: d.get(k) for k in keys}

    @property
    def first_text(self) -> str:
        if self.first and self.first.step in self.serving:
            return packed.first_text(self.first, self.serving[self.first.step])
        text = str(self.first) if self.first else ""
        r = self.first_record
        if r is not None and r.rank_text is not None:  # a sharded case: which rank, which of its tensors
            f = r.rank_figures
            text += f", {r.rank_text}: {f['tensor']}" + (f" ({f['share']})" if f["share"] else "")
        return text

    def target(self, stage: str, step: int | None = None) -> str:
        """Anchor on the case page for a stage (of one step): its first failing tensor's section (the
        first divergence first), else that tensor's row, else the stage's first row in the metrics tables."""
        recs = [r for r in self.records if r.stage == stage and (step is None or r.step == step)]
        fails = [r for r in recs if r.verdict == "fail"]
        if fails:
            return min(fails, key=lambda r: (not r.first, not r.sectioned, r.step)).link
        return f"t-{recs[0].anchor}" if recs else "pipeline"


def worst_verdict(verdicts) -> str:
    vs = [v for v in verdicts if v in VERDICT_ORDER]
    return min(vs, key=VERDICT_ORDER.__getitem__) if vs else "none"


def _record_view(rec: dict, index: int) -> RecordView:
    return RecordView(**vars(Record.from_json(rec)), anchor=f"r{index}", raw=rec)


def _is_first(r: RecordView, fd: FirstDivergence | None) -> bool:
    return fd is not None and r.verdict == "fail" and (r.step, r.tensor, r.stage) == (fd.step, fd.tensor, fd.stage)


def case_view(case: dict, page: str, columns: list[str]) -> CaseView:
    records = [_record_view(r, i) for i, r in enumerate(case.get("records", []))]
    fd = FirstDivergence.from_json(case.get("first_divergence"))
    serving = packed.layouts(case)
    marked = False  # one first divergence: a sharded case's failing ranks share its step, tensor and stage, and
    for r in records:  # the first of them is the one verify named
        r.first = not marked and _is_first(r, fd)
        marked = marked or r.first
        r.serving = serving.get(r.step)
    steps: dict[int, list[RecordView]] = {}
    for r in records:
        steps.setdefault(r.step, []).append(r)
    step_views = []
    for step, recs in sorted(steps.items()):
        recs.sort(key=lambda r: (r.stage_index, tensor_rank(r.tensor)))
        cells = {s: worst_verdict(r.verdict for r in recs if r.stage == s) for s in columns}
        first_stage = fd.stage if fd and fd.step == step else None
        seq_pos = next((r.raw.get("seq_pos") for r in recs if r.raw.get("seq_pos") is not None), None)
        step_views.append(StepView(step, recs[0].op, recs[0].call, seq_pos, recs, cells, first_stage,
                                   serving.get(step)))
    cells = {s: worst_verdict(r.verdict for r in records if r.stage == s) for s in columns}
    counts = {s: (sum(r.verdict == "fail" for r in records if r.stage == s),
                  sum(r.verdict in ("pass", "fail") for r in records if r.stage == s)) for s in columns}
    return CaseView(raw=case, id=str(case["id"]), page=page, kind=str(case.get("kind")),
                    tags=[str(t) for t in case.get("tags", [])], status=case["status"], steps=step_views,
                    records=records, cells=cells, cell_calls=counts, first=fd, serving=serving)


@dataclass
class ReportView:
    summary: dict
    cases: list[CaseView]
    columns: list[str]
    tags: list[str]
    first_stages: list[tuple[str, int]]  # (first diverging stage or reason, number of cases), most first
    first_cases: dict[str, list[CaseView]]  # stage or reason -> its failing cases

    @property
    def totals(self) -> dict:
        return self.summary["totals"]


def build(summary: dict) -> ReportView:
    """The view of a summary checked by :func:`load_summary`."""
    columns = list(GRID_STAGES)
    present = {str(r["stage"]) for case in summary["cases"] for r in case.get("records", [])}
    if present & set(MOE_GRID_STAGES):  # the block's stages between post_norm and mlp
        at = columns.index("mlp")
        columns[at:at] = [s for s in MOE_GRID_STAGES if s in present]
    for case in summary["cases"]:
        for r in case.get("records", []):
            if r["stage"] not in columns:
                columns.append(str(r["stage"]))
    taken: set[str] = {"index"}
    cases = [case_view(c, slug(str(c["id"]), taken), columns) for c in summary["cases"]]
    tags = sorted({str(t) for c in cases for t in c.tags})
    firsts = Counter()
    first_cases: dict[str, list[CaseView]] = {}
    for c in cases:
        if c.status == "fail" and c.first:
            key = c.first.stage or (c.first.reason or "?").replace("_", " ")
            firsts[key] += 1
            first_cases.setdefault(key, []).append(c)
    return ReportView(summary, cases, columns, tags, firsts.most_common(), first_cases)


def fmt_num(v, digits: int = 3) -> str:
    """A number for a table: ``1.23e-04``, ``0``, ``inf``, ``nan``; ``—`` for none."""
    if v is None:
        return "—"
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    if 1e-3 <= abs(v) < 1e4:
        return f"{v:.{digits}g}"
    return f"{v:.{max(digits - 1, 1)}e}"
