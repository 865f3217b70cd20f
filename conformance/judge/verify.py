"""``gdncheck verify``: judge a port's outputs against the goldens, per case, call and stage tensor.

:func:`verify` is what the CLI and the gate call. A case whose inputs cannot be used (fixture or
outputs file missing, truncated, damaged, of another fixture version, outside its folder) is
reported with status ``error`` and the reason; every other case is still verified
(:class:`~.case.CaseJudge` judges one case). Nothing is written here; :meth:`Summary.write` writes
the JSON atomically.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from gdncheck._version import __version__
from gdncheck.errors import GDNError
from gdncheck.fixtures.manifest import (
    CaseProblem,
    FixtureError,
    check_manifest_sha256,
    load_manifest,
    select_cases,
    sha256_file,
)
from gdncheck.harness import END_TO_END, STAGE_ISOLATED, call_steps, is_packed, mode_name
from gdncheck.harness.sharded import shard_step
from gdncheck.profiles import VERIFY_PROFILES, choices
from gdncheck.safetensors_io import SafetensorsFile
from gdncheck.untrusted import safe_text

from .aliases import load_names
from .case import CaseJudge
from .diagnose import advise
from .filenames import plan_names
from .provenance import Provenance
from .records import CaseReport, Summary
from .tolerances import ToleranceTable, load_table
from .xfails import Tally, XFail, failing_names, load_xfails, unmatched, unmatched_line


def verify(fixtures_dir: str | Path, outputs_dir: str | Path, profile: str, *, cases: list[str] | None = None,
           tags: list[str] | None = None, shard: tuple[int, int] | None = None, stage_isolated: bool = False,
           fused: bool = False, tolerances: str | Path | ToleranceTable | None = None,
           progress: Callable[[CaseReport], None] | None = None, names: str | None = None,
           diagnose: Callable | None = None, manifest_sha256: str | None = None,
           max_fail: int | None = None, allow_looser_tolerances: bool = False,
           xfails: str | Path | list[XFail] | None = None) -> Summary:
    """Verify the outputs in ``outputs_dir`` against the fixtures in ``fixtures_dir`` at ``profile``.

    ``cases`` (ids or id prefixes), ``tags`` and ``shard=(i, n)`` select cases; ``names`` reads the
    outputs through a name table (:mod:`.aliases`: ``hf``, ``doppler``, ``metrale`` or a path);
    ``manifest_sha256`` pins the fixture manifest. ``fused`` judges a fused kernel's stage-isolated outputs
    (its stage inputs the goldens') against the end-to-end bounds of the profile, not the stage bounds:
    a kernel that computes several stages from one stage's golden inputs inherits their rounding, which
    only the whole layer's bounds grant (docs/verify.md, Fused kernels). Raises :class:`FixtureError` only when the run
    cannot start: the fixture folder unusable (no readable manifest, another manifest than the pinned
    one), a selection of no case (:class:`~gdncheck.fixtures.manifest.SelectionError`), an unknown
    name table or profile. ``diagnose`` (a :class:`~.diagnose.Diagnoser`) names the likely cause of
    each failing case at its first divergence; it never changes a verdict. ``max_fail`` stops judging
    once that many cases fail: the cases left are not judged, and the summary says so (a note, and
    ``summary.stopped_early``: ``{max_fail, cases_judged, cases_not_judged}``, else None); its verdict
    stays "does not conform", never a pass. ``xfails`` (a known-failures file or its entries:
    :mod:`.xfails`) sets known failures apart: a failing case an entry covers stays ``fail`` but is
    listed in ``summary.xfails["known_failures"]`` and counts neither in the exit code nor towards
    ``max_fail``; an entry of a case that passed is listed stale (and noted).
    """
    stage_isolated = stage_isolated or fused
    xfails_file = None
    if isinstance(xfails, str | Path):
        xfails_file, xfails = str(xfails), load_xfails(xfails)
    tally = Tally(xfails, profile) if xfails is not None else None
    table = tolerances if isinstance(tolerances, ToleranceTable) else load_table(
        tolerances, allow_looser=allow_looser_tolerances)
    name_table = load_names(names)
    if profile not in VERIFY_PROFILES:
        raise FixtureError(f"expected --profile {choices(VERIFY_PROFILES)}, found {profile!r}")
    if manifest_sha256 is not None:
        check_manifest_sha256(fixtures_dir, manifest_sha256)
    problems: list[CaseProblem] = []
    manifest = load_manifest(fixtures_dir, problems)
    entries = select_cases(manifest, cases, tags, shard, also_known=[p.case for p in problems])
    summary = _new_summary(fixtures_dir, outputs_dir, manifest, profile, stage_isolated, fused, table, name_table)
    entries = _judged_in_mode(entries, stage_isolated, summary, Path(outputs_dir))
    for p in problems:
        if not cases or any(p.case.startswith(c) for c in cases):
            summary.cases.append(CaseReport(p.case, "unknown", [], "error", problem=p.message))
            if progress:
                progress(summary.cases[-1])
    judge = partial(CaseJudge, Path(fixtures_dir), Path(outputs_dir), profile=profile, table=table,
                    stage_isolated=stage_isolated, names=name_table, bounds=END_TO_END if fused else None)
    impls = _judge_cases(entries, judge, summary, tally=tally, diagnose=diagnose, progress=progress,
                         max_fail=max_fail, provenance=Provenance(fixtures_dir, manifest))
    summary.implementation = _implementation(impls, profile, summary)
    if tally is not None:
        suite_ids = [e["id"] for e in manifest["cases"]] + [p.case for p in problems]
        summary.xfails = _xfails_section(tally, xfails_file, summary, suite_ids)
    return summary


def _new_summary(fixtures_dir, outputs_dir, manifest: dict, profile: str, stage_isolated: bool, fused: bool,
                 table: ToleranceTable, name_table) -> Summary:
    """The summary of a run before any case: what is judged, against what, here."""
    summary = Summary(
        profile=profile, mode=mode_name(stage_isolated), implementation={}, tolerances=table.describe(),
        fixtures={"dir": str(fixtures_dir), "suite": manifest["suite"], "format_version": manifest["format_version"],
                  "manifest_sha256": sha256_file(Path(fixtures_dir) / "manifest.json"),
                  "generator": manifest["generator"]},
        outputs={"dir": str(outputs_dir), "names": name_table.source if name_table else None},
        environment={"python": platform.python_version(), "numpy": np.__version__, "platform": platform.platform()},
        tool={"name": "gdncheck", "version": __version__}, bounds=END_TO_END if fused else None,
    )
    if table.looser:  # allowed by name only (tolerances.py): every verdict judged with it says so
        summary.notes.append(f"judged with a tolerance table that loosens {len(table.looser)} bound(s) of the shipped "
                             f"one (--allow-looser-tolerances; {table.source}): a verdict here is not the release's")
    if fused:
        summary.notes.append("fused: stage-isolated outputs judged against the end-to-end bounds of the profile (a "
                             "fused kernel fed one stage's golden inputs inherits the rounding of the stages it "
                             "computes itself; docs/verify.md, Fused kernels)")
    return summary


def _isolated_sharded_run(outputs_dir: Path, case: str) -> bool:
    """Whether a sharded case's outputs file is a stage-isolated run's (a stage-isolated context-parallel port,
    gdncheck.harness.sharded): then stage-isolated mode judges it (its metadata checked as any outputs file's)."""
    path = outputs_dir / f"{case}.safetensors"
    try:
        if path.is_symlink() or not path.is_file():
            return False
        meta = SafetensorsFile(path).metadata
    except (GDNError, OSError, ValueError):
        return False
    return meta.get("mode") == STAGE_ISOLATED and "sharded" in meta


def _judged_in_mode(entries: list[dict], stage_isolated: bool, summary: Summary, outputs_dir: Path) -> list[dict]:
    """The selected cases the mode judges: stage-isolated, no expected-error case and no serving case that
    keeps no stage inputs (its calls are packed, judged end to end only: FORMAT.md §8), each left out with a
    note. A serving case that keeps them (``state_in``: the real-size ones) is judged call by call where the
    run wrote its outputs file; a runner that skips packed calls (as every one did before they kept stage
    inputs) writes none, and the case is left out with a note of its own."""
    if not stage_isolated:
        return entries
    sharded = [e["id"] for e in entries if e["kind"] != "error" and shard_step(e["program"]) is not None
               and not _isolated_sharded_run(outputs_dir, e["id"])]
    if sharded:  # FORMAT.md §4.2: a sharded case is judged end to end, rank by rank (but a stage-isolated
        # context-parallel port's: its outputs file says so, and its ranks are judged by stage; docs/sharding.md)
        summary.notes.append(f"stage-isolated mode: {len(sharded)} sharded case(s) not applicable (judged end to end, "
                             "rank by rank: FORMAT.md §4.2, §7.1)")
        entries = [e for e in entries if e["id"] not in sharded]
    skipped = [e["id"] for e in entries if e["kind"] == "error"]
    packed = [e for e in entries if e["kind"] != "error" and _only_packed(e)]
    serving = [e["id"] for e in packed if not e.get("state_in")]
    unrun = [e["id"] for e in packed if e.get("state_in") and not (outputs_dir / f"{e['id']}.safetensors").exists()]
    if skipped:
        summary.notes.append(f"stage-isolated mode: {len(skipped)} expected-error case(s) not applicable")
    if serving:  # FORMAT.md §8: packed calls are judged end to end only
        summary.notes.append(f"stage-isolated mode: {len(serving)} serving case(s) not applicable (their calls are "
                             "packed and keep no stage inputs, judged end to end only: FORMAT.md §8)")
    if unrun:
        summary.notes.append(f"stage-isolated mode: {len(unrun)} serving case(s) keep their packed calls' stage "
                             f"inputs but have no outputs file, not judged ({', '.join(unrun)}; a runner without "
                             "packed stage calls: FORMAT.md §8, packed calls)")
    return [e for e in entries if e["kind"] != "error" and e["id"] not in serving and e["id"] not in unrun]


def _judge_cases(entries: list[dict], judge: Callable[[dict], CaseJudge], summary: Summary, *, tally: Tally | None,
                 diagnose: Callable | None, progress: Callable | None, max_fail: int | None,
                 provenance: Provenance) -> dict[str, dict]:
    """Judge each case in turn into ``summary`` (a failing case's goldens checked against their recipe,
    its likely cause named), stopping after ``max_fail`` failures; the outputs metadata of each case."""
    impls: dict[str, dict] = {}  # case -> the metadata of its usable outputs file
    failed = 0
    clashes = plan_names(entries, judge.keywords["stage_isolated"])  # the names gdncheck run refuses to write
    for done, entry in enumerate(entries, 1):
        cj = judge(entry)
        if entry["id"] in clashes:  # a bad manifest entry (exit 2), never a failure of the port
            cj.report.status = "error"
            cj.report.problem = safe_text(f"manifest entry unusable: {clashes[entry['id']]} (gdncheck run skips this "
                                          "case; a file it names cannot be told from another use's)")
            report = cj.report
        else:
            report = cj.run()
        known = tally.see(report, _impl_names(cj.meta)) if tally is not None else None
        tampered = provenance.check(entry) if report.status == "fail" else None
        if tampered:  # the goldens, not the port: said on the case, and instead of a bug class
            report.notes.append(tampered)
            report.diagnosis = {"verdict": "none", "text": tampered, "tensor": None, "call": None}
        # a known failure's cause is known; a sharded case's facts (its rank and stage) stand
        elif diagnose is not None and report.status == "fail" and known is None and not (
                report.diagnosis and report.diagnosis.get("verdict") == "none"):
            report.diagnosis = advise(diagnose, cj, report)
        if cj.meta:
            impls[entry["id"]] = cj.meta
        summary.cases.append(report)
        if progress:
            progress(report)
        failed += report.status == "fail" and known is None
        if max_fail is not None and failed >= max_fail and done < len(entries):
            left = len(entries) - done
            summary.stopped_early = {"max_fail": max_fail, "cases_judged": len(summary.cases),
                                     "cases_not_judged": left}
            summary.notes.append(f"stopped early: {failed} case(s) failed (max_fail {max_fail}), so {left} of the "
                                 f"{len(entries)} selected case(s) were not judged")
            break
    if provenance.note():
        summary.notes.append(provenance.note())
    return impls


def _impl_names(meta: dict | None) -> list[str]:
    """The names a known-failures entry's IMPL may give a case's implementation: as it names itself
    (the outputs' ``implementation``) and as ``gdncheck run`` was given it (``run_config``)."""
    meta = meta or {}
    names = [meta["implementation"]] if isinstance(meta.get("implementation"), str) else []
    try:
        given = json.loads(meta.get("run_config") or "{}").get("implementation")
    except (ValueError, AttributeError):
        given = None
    return names + ([given] if isinstance(given, str) else [])


def _xfails_section(tally: Tally, file: str | None, summary: Summary, suite_ids: list[str]) -> dict:
    """The summary's ``xfails``: the known failures set apart; the stale entries, the entries refused
    (a case that broke the coverage rule) and those that matched no case of the run, each noted."""
    files = sorted({x.file for x in tally.xfails if x.file})
    where = file or (files[0] if len(files) == 1 else None)
    stale = tally.stale()
    for x in stale:
        summary.notes.append(f"stale known failure ({x.where()}: {x.impl} {x.profile} {x.case} "
                             f"{','.join(x.tensors)}): the case passes in {summary.profile} now; delete the entry")
    for case, (x, why) in tally.refused.items():
        summary.notes.append(f"known failure {x.where()} does not excuse case {case}: {why}, which the coverage rule "
                             "fails whatever a known-failures file says (fixtures/FORMAT.md §2)")
    failing = [c.id for c in summary.cases if c.status == "fail"]
    wild = sorted({x.line for case, x in tally.known.items() if x.tensors == ("*",)})
    if failing and len(tally.known) == len(failing) and wild:  # said, never silent (the verdict is the rule's)
        summary.notes.append(f"the known failures excuse every one of the {len(failing)} failing case(s), "
                             f"{sum(x.tensors == ('*',) for x in tally.known.values())} of them by entries whose WHAT "
                             f"is '*' (any tensor; line(s) {', '.join(map(str, wild[:10]))}"
                             f"{', ...' if len(wild) > 10 else ''}): such entries let any failure of their cases "
                             "through; name the tensors or stages that fail")
    lost = unmatched(tally.xfails, tally.applied, profiles=[summary.profile], impl_names=tally.impl_names,
                     suite_ids=suite_ids)
    if lost:
        summary.notes.append(unmatched_line(lost))
    by_id = {c.id: c for c in summary.cases}
    return {"file": where or "", "entries": len(tally.xfails),
            "known_failures": [{"case": case, "tensors": failing_names(by_id[case]), "reason": x.reason,
                                "line": x.line} for case, x in tally.known.items()],
            "stale": [x.to_json() for x in stale],
            "refused": [{"case": case, "line": x.line, "why": why} for case, (x, why) in tally.refused.items()],
            "unmatched": [{**x.to_json(), "why": why} for x, why in lost]}


def _only_packed(entry: dict) -> bool:
    """Whether every call of a case is a packed serving call (nothing a stage-isolated run judges)."""
    calls = call_steps(entry["program"])
    return bool(calls) and all(is_packed(s) for s in calls)


def _implementation(impls: dict[str, dict], profile: str, summary: Summary) -> dict:
    names = sorted({m.get("implementation", "unknown") for m in impls.values()})
    profiles = sorted({m.get("profile", "") for m in impls.values()} - {""})
    if profiles and profiles != [profile]:
        summary.notes.append(f"outputs were produced in profile {', '.join(profiles)}, verified at {profile}")
    first = next(iter(impls.values()), {})
    return {"name": ", ".join(names) if names else "unknown", "profile": ", ".join(profiles) or None,
            "device": first.get("device"), "command": first.get("command")}
