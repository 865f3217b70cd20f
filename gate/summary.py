"""``OUT/gate-summary.json``: the gate's document, section by section, and its JSON Schema.

The sections are written in the order the gate reaches them (docs/gate.md lists every field): the
head (:func:`head`), what was planned (implementation, fixtures, selection, the properties' settings),
the timing of the work, one section per profile (:func:`profile_section`), the known failures, the
property results, the environment. A run that could not run stops after the sections it reached.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

from gdncheck._version import __version__
from gdncheck.conformance.judge.records import Summary
from gdncheck.safetensors_io import write_bytes_atomic
from gdncheck.untrusted import safe_text

SCHEMA = "gdncheck-gate-summary"
SCHEMA_VERSION = 1
#: JSON Schema (draft 2020-12) of OUT/gate-summary.json
SCHEMA_PATH = Path(__file__).with_name("gate_summary.schema.json")

VERDICTS = {0: "conforms", 1: "does not conform", 2: "could not run"}
PROPERTY_STATUSES = ("pass", "fail", "skip")


def validate_gate_summary(doc: dict) -> None:
    """Raise ``jsonschema.ValidationError`` if ``doc`` breaks the gate-summary schema."""
    import jsonschema  # deferred: only a caller that validates pays for it

    jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text())).validate(doc)


def head(impl: str, options: dict, out: Path) -> dict:
    """The first rows, before anything ran: verdict, exit code and reason still open."""
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "tool": {"name": "gdncheck", "version": __version__},
            "verdict": None, "exit_code": None, "reason": None,
            "implementation": {"spec": impl, "options": options}, "outputs": {"dir": str(out)}}


def profile_code(summary: Summary) -> int:
    """A profile's exit code, verify's (:attr:`Summary.exit_code`): 2 a case's inputs were unusable or
    nothing was judged, 1 a case fails (known failures aside) or the coverage rule is broken (a known
    failure never mends it), 0."""
    return summary.exit_code


def profile_section(summary: Summary, path: Path, seconds: float) -> dict:
    """One profile's section: its verdict, totals, failures, not-applicable cases and known failures
    (verify's, judged with the gate's known-failures file)."""
    code = profile_code(summary)
    known = summary.known_failures()
    cases = summary.cases
    return {
        "verdict": VERDICTS[code] if code != 2 else summary.verdict(), "exit_code": code,
        "totals": summary.totals(), "coverage": summary.coverage(), "summary": str(path),
        "tolerances": {k: summary.tolerances.get(k) for k in ("sha256", "shipped_sha256", "shipped", "looser_bounds")},
        "implementation": safe_text(summary.implementation.get("name")), "seconds": round(seconds, 2),
        "failures": [{"case": c.id, "status": c.status,
                      "first_divergence": c.first_divergence and c.first_divergence.to_json(),
                      "message": c.message or c.problem, "repro": c.repro,
                      "likely_cause": (c.diagnosis or {}).get("text")}
                     for c in cases if c.status in ("fail", "error") and c.id not in known],
        "not_applicable": [{"case": c.id, "reason": (c.not_applicable or {}).get("reason") or c.message}
                           for c in cases if c.status == "not_applicable"],
        "known_failures": [{"case": c.id, "tensors": sorted({r.tensor for r in c.records if r.verdict == "fail"}),
                            "reason": known[c.id]["reason"], "xfails_line": known[c.id]["line"], "message": c.message}
                           for c in cases if c.id in known],
    }


def nothing_to_verify() -> dict:
    """A profile's section when no case was run (every selected case was skipped): nothing was judged,
    which is never a pass (exit 2)."""
    return {"verdict": "nothing judged", "exit_code": 2, "totals": {}, "failures": [], "known_failures": []}


def could_not_judge_reason(doc: dict) -> str:
    """Why a gate (or a merge) whose profiles reached exit 2 could not judge: the unusable cases and the
    profiles in which nothing was judged, counted per profile as the table's rows are."""
    profiles = doc.get("profiles") or {}
    unusable = sorted({f["case"] for v in profiles.values() for f in v.get("failures", []) if f["status"] == "error"})
    nothing = [p for p, v in profiles.items() if v["verdict"] == "nothing judged"]
    reasons = ([f"inputs unusable for {len(unusable)} case(s): {', '.join(unusable)}"] if unusable else []) + \
              ([f"nothing judged in profile(s) {', '.join(nothing)}: "
                + "; ".join(profiles[nothing[0]].get("coverage", {}).get("problems", [])
                            or ["every selected case was skipped (listed above)"])] if nothing else [])
    return safe_text("; ".join(reasons) or "a profile could not be judged")


def property_totals(results: list[dict]) -> dict:
    return {s: sum(r["status"] == s for r in results) for s in PROPERTY_STATUSES}


def environment(device: str) -> dict:
    env = {"python": platform.python_version(), "platform": platform.platform()}
    try:  # the triton extra: absent for a plug-in environment without torch
        import torch
        import triton

        env.update(torch=torch.__version__, triton=triton.__version__)
        if device == "cuda":
            env["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return env


def write_summary(out: Path, doc: dict) -> Path:
    return write_bytes_atomic(out / "gate-summary.json", (json.dumps(doc, indent=1, default=str) + "\n").encode())
