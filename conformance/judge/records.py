"""Result records: what ``verify`` found, as data for the gate and the HTML report.

One :class:`Record` per (case, call, tensor) and per saved snapshot tensor; one :class:`CaseReport`
per case (its status, :class:`FirstDivergence`, records); one :class:`Summary` per run, serialised to
JSON that ``conformance/judge/summary.schema.json`` describes (docs/verify.md lists every field).
A record and a first divergence read back from that JSON (:meth:`Record.from_json`,
:meth:`FirstDivergence.from_json`) are what the report shows.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from gdncheck.safetensors_io import write_bytes_atomic

SUMMARY_SCHEMA = "gdncheck-verify-summary"
SUMMARY_SCHEMA_VERSION = 1
SUMMARY_SCHEMA_PATH = Path(__file__).with_name("summary.schema.json")

VERDICTS = ("pass", "fail", "missing")
REASONS = ("missing_required", "dtype", "shape", "nan", "inf", "elem_bound", "nmse_bound", "seq_len", "raised",
           "error_expected", "wrong_error", "routing", "sharded")


def _clean(value: Any) -> Any:
    """JSON-safe, in new containers: non-finite floats as the strings "inf", "-inf", "nan", tuples as
    lists, a dataclass as the dict of its fields (what ``dataclasses.asdict`` then cleaning made, in
    one walk: a verify summary of the default suite holds ~4,000 records a profile)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if hasattr(type(value), "__dataclass_fields__") and not isinstance(value, type):
        return {f.name: _clean(getattr(value, f.name)) for f in fields(value)}
    return value


def _unclean(value: Any) -> Any:
    """The inverse of :func:`_clean` for numbers: the strings "inf", "-inf", "nan" as floats again."""
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return float(value)
    if isinstance(value, dict):
        return {k: _unclean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unclean(v) for v in value]
    return value


@dataclass
class Record:
    """The verdict on one tensor of one call (or of one saved snapshot)."""

    case: str
    step: int
    op: str
    call: int | None
    tensor: str
    stage: str
    stage_index: int
    verdict: str
    reason: str | None = None
    message: str | None = None
    dtype: str | None = None
    shape: list[int] | None = None
    expected_shape: list[int] | None = None
    seq_pos: list[int] | None = None
    metrics: dict | None = None
    bound: dict | None = None
    min_tolerance: dict | None = None
    over_bound: int | None = None
    first_bad_token: int | None = None
    first_bad_position: int | None = None
    first_bad_row: int | None = None
    token_profile: dict | None = None
    expected_ref: dict | None = None
    actual_ref: dict | None = None
    routing: dict | None = None  # a sparse layer's selected_experts routed otherwise (routing.py)
    convention: dict | None = None  # a convention the port chose where correct engines differ (routing.py)
    #: a rank's share of a sharded case that failed, or a passing tensor's worst share (sharded.py):
    #: ``rank``, ``max_err`` (of the whole tensor's scale), ``nmse`` (the share's), ``elem_bound``, ``nmse_bound``
    shard: dict | None = None
    #: the failure in parts (messages.Failure), of which ``message`` is the text; not written to a summary
    failure: Any = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict:
        return {f.name: _clean(getattr(self, f.name)) for f in _RECORD_FIELDS}

    @classmethod
    def from_json(cls, doc: dict) -> Record:
        """A record of a summary, non-finite numbers restored (its numeric fields only: a message stays text)."""
        numeric = ("metrics", "bound", "min_tolerance", "token_profile", "shard")
        return cls(**{f.name: _unclean(doc[f.name]) if f.name in numeric else doc[f.name]
                      for f in fields(Record) if f.name in doc})


_RECORD_FIELDS = tuple(f for f in fields(Record) if f.name != "failure")  # what a summary holds of a record


@dataclass(frozen=True)
class FirstDivergence:
    """Where a failing case first departs from the goldens: the earliest failing step, then the
    earliest stage and tensor in pipeline order, then the first token over the bound; or, for a case
    that failed without a tensor record (it raised, or raised the wrong error), the step and why."""

    step: int | None
    call: int | None
    op: str | None
    stage: str | None
    tensor: str | None
    token: int | None
    position: int | None
    row: int | None
    reason: str | None

    @classmethod
    def of_record(cls, rec: Record) -> FirstDivergence:
        return cls(rec.step, rec.call, rec.op, rec.stage, rec.tensor, rec.first_bad_token, rec.first_bad_position,
                   rec.first_bad_row, rec.reason)

    @classmethod
    def at_step(cls, step: int | None, op: str, reason: str) -> FirstDivergence:
        """A failure of a whole step (no tensor): the implementation raised, or raised the wrong error."""
        return cls(step, None, op, None, None, None, None, None, reason)

    @classmethod
    def from_json(cls, doc: dict | None) -> FirstDivergence | None:
        return None if doc is None else cls(**{f.name: doc.get(f.name) for f in fields(cls)})

    def to_json(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        """``call 1, stage delta_rule, tensor core, token 1877 (position 1929, row 0)``, or where and why."""
        parts = []
        if self.call is not None:
            parts.append(f"call {self.call}" + (" (commit)" if self.op == "commit" else ""))
        elif self.op == "save":
            parts.append("saved snapshot")
        elif self.step is not None:
            parts.append(f"step {self.step} ({self.op})")
        parts += [f"{k} {v}" for k, v in (("stage", self.stage), ("tensor", self.tensor)) if v]
        if self.token is not None:
            extra = [f"{k} {v}" for k, v in (("position", self.position), ("row", self.row)) if v is not None]
            parts.append(f"token {self.token}" + (f" ({', '.join(extra)})" if extra else ""))
        if self.reason and not self.tensor:
            parts.append(self.reason.replace("_", " "))
        return ", ".join(parts)


@dataclass
class CaseReport:
    id: str
    kind: str
    tags: list[str]
    status: str  # pass | fail | error | not_applicable
    file: str | None = None
    outputs_file: str | None = None
    problem: str | None = None  # why the case could not be verified (status error)
    first_divergence: FirstDivergence | None = None
    message: str | None = None  # the first failure's message
    repro: str | None = None
    counts: dict = field(default_factory=lambda: {"pass": 0, "fail": 0, "missing": 0})
    error_check: dict | None = None
    not_applicable: dict | None = None  # {step, op, reason}: the implementation cannot express the case from there
    regime: str | None = None  # the regime the case probes (the manifest's: "realistic" or "edge: ...")
    diagnosis: dict | None = None  # the likely cause at the first divergence (judge/diagnose.py); advice only
    notes: list[str] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    features: list[str] = field(default_factory=list)  # the case's optional features (coverage; [] = must be judged)
    serving: list[dict] = field(default_factory=list)  # the layout of each serving step judged (packed.layout)

    @property
    def judged(self) -> int:
        """Tensors judged (passed or failed; not ``missing``)."""
        return sum(r.verdict != "missing" for r in self.records)

    def to_json(self) -> dict:
        d = {f.name: _clean(getattr(self, f.name)) for f in fields(self) if f.name != "records"}
        d["records"] = [r.to_json() for r in self.records]  # each clean already
        d["judged"] = self.judged
        return d


@dataclass
class Summary:
    profile: str
    mode: str
    implementation: dict
    tolerances: dict
    fixtures: dict
    outputs: dict
    environment: dict
    tool: dict
    cases: list[CaseReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: verify's max_fail stopped judging early: {max_fail, cases_judged, cases_not_judged}; None: it did not
    stopped_early: dict | None = None
    #: verify's xfails: {file, entries, known_failures: [{case, tensors, reason, line}], stale: [entry]};
    #: None: no known-failures file
    xfails: dict | None = None
    #: the bounds judged against when they are not the mode's own: "end_to_end" for a fused kernel's
    #: stage-isolated outputs (verify's ``fused``); None: the mode's
    bounds: str | None = None

    def mode_text(self) -> str:
        """The mode as a console line says it: ``stage_isolated, end-to-end bounds (fused)`` for fused."""
        return f"{self.mode}, end-to-end bounds (fused)" if self.bounds else self.mode

    @property
    def exit_code(self) -> int:
        """2 inputs unusable, or nothing of the port judged; 1 a case fails (a known failure of the
        xfails file does not); else the coverage rule (:meth:`coverage`): broken, 2 when no tensor was
        judged (nothing judged), else 1; 0 only when it holds. A not_applicable case counts neither way,
        nor does a case only gdncheck's own config parser answered (the port never called): a run of
        nothing else judged nothing. So ``coverage.ok`` false is never exit 0, whatever the known
        failures."""
        if any(c.status == "error" for c in self.cases) or not self.port_judged():
            return 2
        known = self.known_failures()
        if any(c.status == "fail" and c.id not in known for c in self.cases):
            return 1
        cov = self.coverage()  # known failures explain failures; they never make a broken coverage a pass
        if not cov["ok"]:
            return 2 if cov["tensors_judged"] == 0 else 1
        return 0

    def known_failures(self) -> dict[str, dict]:
        """case id -> its known-failure entry ``{case, tensors, reason, line}`` (verify's xfails)."""
        return {k["case"]: k for k in (self.xfails or {}).get("known_failures", [])}

    def port_judged(self) -> list[CaseReport]:
        """The cases that judged the port: passed or failed, and not answered by gdncheck's own parser."""
        return [c for c in self.cases if c.status in ("pass", "fail") and not own_check(c)]

    def coverage(self) -> dict:
        """What the run judged against what the coverage rule asks (fixtures/FORMAT.md §2): every case
        with no optional feature judged, every judged case judging at least one tensor, something judged."""
        judged = [c for c in self.cases if c.status in ("pass", "fail")]
        required = [c for c in self.cases if not c.features]
        na = [c for c in self.cases if c.not_applicable is not None]
        problems = []
        own = [c for c in judged if own_check(c)]
        if not judged:
            problems.append("nothing was judged: " + ("no case selected" if not self.cases else
                                                      "every selected case is not applicable or unusable"))
        elif len(own) == len(judged):
            problems.append(f"nothing of the port was judged: the {len(own)} judged case(s) were answered by "
                            "gdncheck's own config parser before the port was called (error_raised_by gdncheck)")
        bad_na = sorted(c.id for c in na if not c.features)
        if bad_na:
            problems.append(f"{len(bad_na)} case(s) every port must run declared not applicable: {', '.join(bad_na)}")
        empty = sorted(c.id for c in self.cases if c.first_divergence is not None
                       and c.first_divergence.reason == "nothing_judged")
        if empty:
            problems.append(f"{len(empty)} case(s) judged no tensor: {', '.join(empty)}")
        port = [c for c in judged if not own_check(c)]
        known = self.known_failures()
        # a run passes only if a case that judged tensors passed: an expected-error case (it judges no
        # tensor) or a not-applicable one shows nothing of the port computes right
        computed = [c for c in port if c.status == "pass" and c.judged > 0]
        if port and not computed and any(c.id in known for c in port):
            others = sum(c.status == "pass" for c in port)
            problems.append(f"no case passed that judged a tensor: of the {len(port)} case(s) of the port judged, "
                            f"{sum(c.id in known for c in port)} are known failures (--xfails)"
                            + (f" and {others} passed judging no tensor (expected errors)" if others else "")
                            + ": a known failure explains a failure, it shows nothing conforms")
        tensors = sum(c.judged for c in self.cases)
        if port and not tensors and not problems:
            problems.append(f"no tensor was judged: none of the {len(port)} case(s) of the port judged compared a "
                            "tensor (an expected-error case checks only that bad input is refused; select a case "
                            "that computes)")
        features: dict[str, int] = {}
        for c in na:
            for f in c.features:
                features[f] = features.get(f, 0) + 1
        return {"cases": len(self.cases), "judged": len(judged), "gdncheck_checks": len(own),
                "required": len(required), "required_judged": sum(c in judged for c in required),
                "not_applicable": len([c for c in na if c.status == "not_applicable"]),
                "not_applicable_features": features, "tensors_judged": tensors,
                "ok": not problems, "problems": problems}

    def coverage_line(self) -> str:
        """One line for a console: what was judged, what was not applicable, and what breaks the rule."""
        cov = self.coverage()
        na = self.declared_not_applicable()
        line = (f"coverage: {cov['judged']} of {cov['cases']} case(s) judged ({cov['required_judged']} of "
                f"{cov['required']} every port must run), {cov['not_applicable']} not applicable"
                + (f" (as the port declared: {na})" if na else "") + f", {cov['tensors_judged']} tensor(s) judged")
        return line + ("" if cov["ok"] else "; " + "; ".join(cov["problems"]))

    def declared_not_applicable(self, groups: int = 4, width: int = 60) -> str:
        """The reasons the port gave for its not-applicable cases, each once with its number of cases,
        most first (``"no snapshot files" 2, "no strict mode" 1``): what it declared, in its words (a
        case's features say what the case needs, not what the port lacks)."""
        counts: dict[str, int] = {}
        for c in self.cases:
            if c.status == "not_applicable" and c.not_applicable is not None:
                reason = " ".join(str(c.not_applicable.get("reason") or "no reason given").split())
                reason = reason if len(reason) <= width else reason[: width - 1] + "…"
                counts[reason] = counts.get(reason, 0) + 1
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])  # stable: ties in order of appearance
        text = ", ".join(f"{json.dumps(r, ensure_ascii=False)} {n}" for r, n in ranked[:groups])
        rest = ranked[groups:]
        return text + (f", {len(rest)} other reason(s) {sum(n for _, n in rest)}" if rest else "")

    def totals(self) -> dict:
        recs = [r for c in self.cases for r in c.records]
        return {
            "cases": len(self.cases),
            "passed": sum(c.status == "pass" for c in self.cases),
            "failed": sum(c.status == "fail" for c in self.cases),
            "errors": sum(c.status == "error" for c in self.cases),
            "not_applicable": sum(c.status == "not_applicable" for c in self.cases),
            "records": len(recs),
            "records_failed": sum(r.verdict == "fail" for r in recs),
            "records_missing": sum(r.verdict == "missing" for r in recs),
        }

    def verdict(self) -> str:
        if self.exit_code == 2 and not any(c.status == "error" for c in self.cases):
            return "nothing judged"
        return {0: "conforms", 1: "does not conform", 2: "inputs unusable"}[self.exit_code]

    def to_json(self) -> dict:
        head = _clean({
            "schema": SUMMARY_SCHEMA,
            "schema_version": SUMMARY_SCHEMA_VERSION,
            "tool": self.tool,
            "implementation": self.implementation,
            "profile": self.profile,
            "mode": self.mode,
            **({"bounds": self.bounds} if self.bounds else {}),
            "verdict": self.verdict(),
            "exit_code": self.exit_code,
            "tolerances": self.tolerances,
            "fixtures": self.fixtures,
            "outputs": self.outputs,
            "environment": self.environment,
            "totals": self.totals(),
            "coverage": self.coverage(),
            "notes": self.notes,
            "stopped_early": self.stopped_early,
            "xfails": self.xfails,
        })
        head["cases"] = [c.to_json() for c in self.cases]  # each clean already
        return head

    def write(self, path: str | Path) -> Path:
        return write_bytes_atomic(path, (json.dumps(self.to_json(), indent=1) + "\n").encode())


def summary_schema() -> dict:
    return json.loads(SUMMARY_SCHEMA_PATH.read_text())


def validate_summary(doc: dict) -> None:
    """Raise ``jsonschema.ValidationError`` if ``doc`` breaks the summary schema."""
    import jsonschema

    jsonschema.Draft202012Validator(summary_schema()).validate(doc)


def own_check(case: CaseReport) -> bool:
    """Whether a case was answered by gdncheck's own config parser, the port never called (its outputs
    file's ``error_raised_by`` is ``gdncheck``): it judges gdncheck, not the port."""
    return case.kind == "error" and (case.error_check or {}).get("raised_by") == "gdncheck"
