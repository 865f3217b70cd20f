"""Judging one case: :class:`CaseJudge` holds what every part of the judging needs (the folders, the
manifest entry, the profile, the tolerance table, the mode, the name table, the open golden and
outputs files) and judges the parts in short methods: the program's calls (each by the judge of its
kind, calls.py), the saved snapshot files, the expected error, and the verdict on the whole case.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.errors import GDNError
from gdncheck.features import requires_of, since_note
from gdncheck.fixtures.coverage import coverage_of
from gdncheck.fixtures.manifest import case_file, safe_file
from gdncheck.harness import CALL_OPS, END_TO_END, call_key, call_steps, mode_name
from gdncheck.harness.sharded import shard_step
from gdncheck.safetensors_io import SafetensorsFile
from gdncheck.stages import STATE_TENSORS, tensor_rank
from gdncheck.untrusted import safe_text

from . import files, messages, packed
from .aliases import NamedOutputs, NameTable
from .calls import call_judge, golden_ref, read_checked
from .metrics import CaseStats, case_stats
from .records import CaseReport, FirstDivergence
from .sharded_case import judge_sharded
from .tolerances import ToleranceTable
from .verdicts import allowed_dtypes, base_record, judge


@dataclass
class CaseJudge:
    """Judges the case ``entry`` of ``fixtures`` against the outputs in ``outputs`` (see the module)."""

    fixtures: Path
    outputs: Path
    entry: dict
    profile: str
    table: ToleranceTable
    stage_isolated: bool = False
    names: NameTable | None = None
    #: the mode whose bounds judge the tensors when not this mode's own (a fused kernel: end to end)
    bounds: str | None = None
    report: CaseReport = field(init=False)
    gold: SafetensorsFile | None = field(default=None, init=False)
    outs: NamedOutputs | None = field(default=None, init=False)
    meta: dict = field(default_factory=dict, init=False)  # the outputs file's metadata
    stats: dict[str, CaseStats] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        e = self.entry
        self.report = CaseReport(e["id"], e["kind"], list(e.get("tags", [])), "pass", file=e["file"],
                                 regime=e.get("regime"), features=list(coverage_of(e)["features"]))
        self.report.repro = self._repro()

    @property
    def case(self) -> str:
        return self.entry["id"]

    @property
    def mode(self) -> str:
        return mode_name(self.stage_isolated)

    @property
    def bound_mode(self) -> str:
        """The mode of the bounds a call's tensors are judged against (verify's ``fused``: end to end)."""
        return self.bounds or self.mode

    # --- the whole case ------------------------------------------------------------------------------
    def run(self) -> CaseReport:
        """The case's report: unusable inputs, the expected error, a raise, or every call judged. An
        unexpected exception (a gdncheck bug) makes this case unusable, never the whole run
        (``GDN_DEBUG=1`` raises it instead)."""
        try:
            return self._run()
        except Exception as exc:  # noqa: BLE001 - one case never stops the others
            if os.environ.get("GDN_DEBUG"):
                raise
            rep = self.report
            rep.status, rep.records, rep.first_divergence, rep.message = "error", [], None, None
            rep.problem = safe_text(f"gdncheck could not judge this case: {type(exc).__name__}: {exc} (a gdncheck "
                                    f"bug: please report it; GDN_DEBUG=1 shows the traceback)")
            return rep

    def _run(self) -> CaseReport:
        problem = self._open_golden() or self._open_outputs()
        if problem:
            self.report.status, self.report.problem = "error", problem
            return self.report
        steps = self.entry["program"]
        err, na = files.raised(self.meta), files.not_applicable(self.meta, steps)
        sharded = self.entry["kind"] == "forward" and shard_step(steps) is not None
        if na is not None:  # judge what ran before the step the implementation cannot express
            self.report.not_applicable = na
            if self.entry["kind"] != "error" and not sharded:  # a sharded case: its ranks, or nothing
                self.judge_program(until=na["step"])
        elif self.entry["kind"] == "error":
            self.judge_expected_error(err)
        elif err is not None:
            op = files.op_at(steps, err.get("step"))
            self.report.status, self.report.message = "fail", str(messages.raised(case=self.case, err=err, op=op))
            self.report.first_divergence = FirstDivergence.at_step(err.get("step"), op, "raised")
        elif sharded:  # every rank's file against its share (FORMAT.md §7.1)
            judge_sharded(self)
        else:
            self.judge_program()
        return self._finish()

    def _repro(self) -> str:
        return messages.repro(str(self.fixtures), str(self.outputs), self.profile, self.case,
                              stage_isolated=self.stage_isolated, fused=self.bounds is not None,
                              run_command=self.meta.get("command"), names=self.names.spec if self.names else None)

    def _open_golden(self) -> str | None:
        try:
            self.gold = SafetensorsFile(case_file(self.fixtures, self.entry))
            files.check_golden(self.entry, self.gold)
        except GDNError as exc:
            return safe_text(f"fixture unusable: {exc}")
        return self._entry_against_golden()

    def _entry_against_golden(self) -> str | None:
        """The manifest entry judges every tensor its case file holds (the file is checksummed, the manifest
        itself is not): a case file of this case id, no tensor of a call the program lacks, and none that its
        call's ``expected`` list leaves out. An edited entry that judges less (an ``expected`` list emptied or
        trimmed, a call removed, an id changed for another recipe's bounds) is a bad manifest entry (exit 2),
        never a pass (docs/bad-inputs.md)."""
        e = self.entry
        said = self.gold.metadata.get("case")
        if said is not None and said != e["id"]:
            return safe_text(f"manifest entry is inconsistent with its case file: {e['file']} holds case {said!r}, "
                             f"but the entry's id is {e['id']!r}")
        calls = {s["call"]: (i, s) for i, s in enumerate(e["program"]) if s["op"] in CALL_OPS}
        for key in self.gold:
            parts = key.split(".", 2)
            if parts[0] != "calls" or len(parts) != 3 or parts[2] == "x" or parts[2].endswith("_in"):
                continue
            at = calls.get(int(parts[1])) if parts[1].isdecimal() and len(parts[1]) <= 9 else None
            if at is None:
                return safe_text(f"manifest entry is inconsistent with its case file: {e['file']} holds {key}, but "
                                 f"the program has no call {parts[1][:20]} (a call removed from the manifest is "
                                 f"never judged)")
            i, step = at
            if e["kind"] == "error" or parts[2] not in step["expected"]:
                return safe_text(f"manifest entry is inconsistent with its case file: {e['file']} holds {key}, but "
                                 f"step {i} ({step['op']}) does not expect {parts[2]!r} (an expected list that "
                                 f"leaves out a golden tensor judges less than the case holds)")
        return None

    def _open_outputs(self) -> str | None:
        name = f"{self.case}.safetensors"
        try:
            path = safe_file(self.outputs, name, "outputs file")
            self.report.outputs_file = str(path)
            if not path.exists():
                return (f"no outputs file {name} in {self.outputs}: run the implementation on this case first "
                        f"(gdncheck run ... --case {self.case})")
            self.outs = NamedOutputs(SafetensorsFile(path), self.names, files.dims(self.entry))
            files.check_outputs_meta(self.entry, self.outs.metadata, self.stage_isolated)
            self.report.notes.extend(safe_text(n) for n in self.outs.notes())
            self.report.notes.extend(self._calls_not_in_program())
        except GDNError as exc:
            return safe_text(f"outputs unusable: {exc}")
        self.meta = self.outs.metadata
        self.report.repro = self._repro()  # now with the command that made the outputs, if it says
        return None

    def _calls_not_in_program(self) -> list[str]:
        """A note for outputs tensors of calls the program does not have (they are never judged)."""
        calls = {str(step["call"]) for step in call_steps(self.entry["program"])}
        extra = sorted({key.split(".")[1] for key in self.outs.file if key.startswith("calls.")
                        and len(key.split(".")) >= 3 and key.split(".")[1] not in calls},
                       key=lambda c: (len(c), c))
        if not extra:
            return []
        shown = ", ".join(safe_text(c)[:40] for c in extra[:10]) + (f" and {len(extra) - 10} more" if len(extra) > 10
                                                                   else "")
        return [f"outputs tensors of call(s) {shown} ignored: the case's program has no such call (its calls: "
                f"{', '.join(sorted(calls, key=int))})"]

    def _finish(self) -> CaseReport:
        """The case's status from its records, then the coverage rule (fixtures/coverage.py): a case
        every port must run is never not applicable, and a case that judged nothing is no pass."""
        rep = self.report
        for r in rep.records:
            rep.counts[r.verdict] = rep.counts.get(r.verdict, 0) + 1
        failed = [r for r in rep.records if r.verdict == "fail"]
        judged = sum(r.verdict != "missing" for r in rep.records)
        na = rep.not_applicable
        if failed and rep.status == "pass":
            rep.status = "fail"
        elif na is not None and rep.status == "pass":
            if rep.features:
                rep.status = "not_applicable"
                rep.message = messages.not_applicable(na=na, passed=judged)  # the tensors written, not the missing
            else:  # a case with no optional feature: every conforming port runs it
                rep.status, rep.message = "fail", str(messages.not_applicable_required(case=self.case, na=na))
                rep.first_divergence = FirstDivergence.at_step(na["step"], na["op"], "not_applicable")
        elif rep.status == "pass" and self.entry["kind"] != "error" and judged == 0:
            first_call = next((i for i, s in enumerate(self.entry["program"]) if s["op"] in CALL_OPS), 0)
            op = self.entry["program"][first_call]["op"]
            rep.status, rep.message = "fail", str(messages.nothing_judged(case=self.case, missing=rep.counts["missing"],
                                                                          mode=self.mode))
            rep.first_divergence = FirstDivergence.at_step(first_call, op, "nothing_judged")
        if failed:
            first = min(failed, key=lambda r: (r.step, r.stage_index, tensor_rank(r.tensor)))
            rep.first_divergence = FirstDivergence.of_record(first)
            rep.message = messages.with_regime(first.message, rep.regime)
        # a port written for an older format (outputs metadata fixture_format_version, FORMAT.md §7): the
        # features the case requires that were added since, said where it fails or is not applicable
        said = na["reason"] if na is not None and rep.status == "not_applicable" else ""  # named there already
        note = since_note((getattr(self, "meta", None) or {}).get("fixture_format_version"),
                          [f for f in requires_of(self.entry) if f not in said])
        if note and rep.status in ("fail", "not_applicable") and rep.message:
            rep.message = f"{rep.message}; {note}"
        return rep

    # --- an error case -------------------------------------------------------------------------------
    def judge_expected_error(self, err: dict | None) -> None:
        rep, expected = self.report, self.entry["expected_error"]
        op = self.entry["program"][expected["step"]]["op"]
        check = {"expected": expected["code"], "accept": expected["accept"], "step": expected["step"],
                 "actual": err["code"] if err else None, "actual_step": err["step"] if err else None,
                 "actual_message": err["message"] if err else None, "match": None,
                 "raised_by": err["raised_by"] if err else None}
        if err is None:
            rep.status, rep.message = "fail", str(messages.error_expected(case=self.case, expected=expected, op=op))
        elif err["code"] in expected["accept"] and err["step"] == expected["step"]:
            check["match"] = "exact" if err["code"] == expected["code"] else "family"
        else:
            failure = messages.wrong_error(case=self.case, err=err, expected=expected, op=op)
            rep.status, rep.message = "fail", str(failure)
        rep.error_check = check
        if rep.status == "fail":
            rep.first_divergence = FirstDivergence.at_step(expected["step"], op,
                                                           "error_expected" if err is None else "wrong_error")

    # --- the program ---------------------------------------------------------------------------------
    def judge_program(self, until: int | None = None) -> None:
        """Judge every call (and saved snapshot) of the program, or of its steps before ``until``."""
        self.stats = self.case_stats()
        for i, step in enumerate(self.entry["program"]):
            if until is not None and i >= until:
                break
            if step["op"] in CALL_OPS:
                self.judge_call(i, step)
            elif step["op"] == "save" and not self.stage_isolated:
                self.judge_snapshot_file(i, step)

    def case_stats(self) -> dict[str, CaseStats]:
        """Per tensor, its scales over every call of the case (metrics.CaseStats), from the goldens."""
        arrays: dict[str, dict[int, np.ndarray]] = {}
        for step in call_steps(self.entry["program"]):
            for name in step["expected"]:
                arr = np.asarray(self.gold[call_key(step["call"], name)])
                arrays.setdefault(name, {})[step["call"]] = packed.as_judged(arr, step, name)
        return case_stats(arrays, float(self.entry["config"].get("rms_norm_eps", 1e-6)))

    def judge_call(self, i: int, step: dict) -> None:
        """Every tensor the golden keeps for this call, then (end to end) its seq_len: the judge of the
        call's kind does it (calls.py: plain, routed, packed)."""
        call_judge(self, i, step).judge()

    # --- a saved snapshot file -----------------------------------------------------------------------
    def judge_snapshot_file(self, i: int, step: dict) -> None:
        """Both states in the file the ``save`` step wrote, against the state after the call it holds."""
        c, where = step["state_of_call"], messages.Where(self.case, i, "save")
        snap, path, problem = self._open_snapshot(step["file"])
        for spec in STATE_TENSORS:
            name = spec.name
            gkey = call_key(c, name) if c is not None else None
            if gkey is not None and gkey not in self.gold:
                continue  # the fixture keeps this state only after the last call
            expected = self.gold.read(gkey) if gkey is not None else self._zero_state(spec)
            rec = base_record(self.case, i, "save", c, name, expected_ref=golden_ref(self, gkey),
                              actual_ref=snap.ref(str(path), name) if snap is not None else
                              {"file": str(path) if path else step["file"], "key": name})
            subject = messages.Subject(name, rec.stage, c, snapshot=step["file"])
            if snap is None:
                rec.expected_shape = list(expected.shape)
                messages.fail(rec, "missing_required",
                              messages.snapshot_missing(subject=subject, problem=problem, where=where))
            else:
                actual, dtype = read_checked(snap, name, expected.shape, allowed_dtypes(name, self.profile)[0])
                judge(rec, actual, dtype, expected, self.table.bound(name, self.profile, END_TO_END, self.case),
                      required=True, subject=subject, where=where, stats=self.stats.get(name))
            self.report.records.append(rec)

    def _open_snapshot(self, file: str) -> tuple[NamedOutputs | None, Path | None, str | None]:
        """(the snapshot file through the name table, its path, why it cannot be read)."""
        try:
            path = safe_file(self.outputs, file, "snapshot file")
            if not path.exists():
                return None, path, f"file {file} is not in {self.outputs}"
            return NamedOutputs(SafetensorsFile(path), self.outs.table, files.dims(self.entry)), path, None
        except GDNError as exc:
            return None, None, safe_text(str(exc))

    def _zero_state(self, spec) -> np.ndarray:
        """A state of the case's dimensions before any call: what a snapshot of no call holds."""
        dims = GDNConfig.from_hf(self.entry["config"]).dims()
        return np.zeros((self.entry["batch"], *(dims[s] for s in spec.shape)))
