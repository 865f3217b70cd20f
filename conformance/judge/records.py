"""Result records: what ``verify`` found, as data for the gate and the HTML report.

One :class:`Record` per (case, call, tensor) and per saved snapshot tensor; one :class:`CaseReport`
per case (its status, first divergence, records); one :class:`Summary` per run, serialised to JSON
that ``conformance/judge/summary.schema.json`` describes (docs/verify.md lists every field).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gdncheck.safetensors_io import write_bytes_atomic

SUMMARY_SCHEMA = "gdncheck-verify-summary"
SUMMARY_SCHEMA_VERSION = 1
SUMMARY_SCHEMA_PATH = Path(__file__).with_name("summary.schema.json")

VERDICTS = ("pass", "fail", "missing")
REASONS = ("missing_required", "dtype", "shape", "nan", "inf", "elem_bound", "nmse_bound", "seq_len", "raised",
           "error_expected", "wrong_error")


def _clean(value: Any) -> Any:
    """JSON-safe: non-finite floats as the strings "inf", "-inf", "nan"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
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

    def to_json(self) -> dict:
        return _clean(asdict(self))


@dataclass
class CaseReport:
    id: str
    kind: str
    tags: list[str]
    status: str  # pass | fail | error | not_applicable
    file: str | None = None
    outputs_file: str | None = None
    problem: str | None = None  # why the case could not be verified (status error)
    first_divergence: dict | None = None
    message: str | None = None  # the first failure's message
    repro: str | None = None
    counts: dict = field(default_factory=lambda: {"pass": 0, "fail": 0, "missing": 0})
    error_check: dict | None = None
    not_applicable: dict | None = None  # {step, op, reason}: the implementation cannot express the case from there
    notes: list[str] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)

    def to_json(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "records"}
        d["records"] = [r.to_json() for r in self.records]
        return _clean(d)


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

    @property
    def exit_code(self) -> int:
        """2 inputs unusable, 1 a case fails, else 0 (not_applicable cases count neither way)."""
        if any(c.status == "error" for c in self.cases):
            return 2
        return 1 if any(c.status == "fail" for c in self.cases) else 0

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
        return {0: "conforms", 1: "does not conform", 2: "inputs unusable"}[self.exit_code]

    def to_json(self) -> dict:
        return _clean({
            "schema": SUMMARY_SCHEMA,
            "schema_version": SUMMARY_SCHEMA_VERSION,
            "tool": self.tool,
            "implementation": self.implementation,
            "profile": self.profile,
            "mode": self.mode,
            "verdict": self.verdict(),
            "exit_code": self.exit_code,
            "tolerances": self.tolerances,
            "fixtures": self.fixtures,
            "outputs": self.outputs,
            "environment": self.environment,
            "totals": self.totals(),
            "notes": self.notes,
            "cases": [c.to_json() for c in self.cases],
        })

    def write(self, path: str | Path) -> Path:
        return write_bytes_atomic(path, (json.dumps(self.to_json(), indent=1) + "\n").encode())


def summary_schema() -> dict:
    return json.loads(SUMMARY_SCHEMA_PATH.read_text())


def validate_summary(doc: dict) -> None:
    """Raise ``jsonschema.ValidationError`` if ``doc`` breaks the summary schema."""
    import jsonschema

    jsonschema.Draft202012Validator(summary_schema()).validate(doc)
