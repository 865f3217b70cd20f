"""`gdncheck gate`: decide whether an implementation conforms, in one call (the CI gate).

`run_gate` is the library entry point the command wraps: check the fixtures (drifted ones are
refused), run the implementation over the selected cases in every profile in worker processes,
verify each profile, search the property suite, then write the gate summary
(`OUT/gate-summary.json`), JUnit XML and the report. In code: four phases over the gate summary
document (`.summary`), `plan`, `execute`, `judge` and `summarise`.

Exit status (`GateResult.exit_code`): 0 conforms, 1 does not conform (a case or a property fails),
2 could not run (`reason` says why).

The steps: README.md, "Use gdncheck as a CI gate"; the options and outputs: docs/gate.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gdncheck.conformance.judge.records import Summary
from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.meta.catalogue import mutant_diagnoser
from gdncheck.conformance.ports.plugin import check_options, load_factory
from gdncheck.conformance.ports.run import default_command
from gdncheck.conformance.properties import PROPERTIES
from gdncheck.errors import GDNError
from gdncheck.fixtures.build import check_suite
from gdncheck.fixtures.manifest import (
    DEFAULT_DIR,
    MANIFEST_NAME,
    CaseProblem,
    FixtureError,
    case_file,
    check_manifest_sha256,
    load_manifest,
    refuse_output_in_suite,
    sha256_file,
)
from gdncheck.profiles import VERIFY_PROFILES
from gdncheck.untrusted import folder_lock, safe_text
from gdncheck.writes import WriteRefused

from . import summary as gs
from .folders import (
    OUTPUTS_MARKER,
    FolderError,
    check_owned,
    fresh,
    refuse_gate_report,
    refuse_gate_writes,
    remove_stale,
)
from .plan import Plan, call_count, plan_cases, plan_properties
from .report import gate_junit, write_report
from .summary import SCHEMA_PATH, VERDICTS, validate_gate_summary
from .workers import Task, execute_tasks, run_case_unit, run_property_unit, run_rebuild_unit
from .xfails import DEFAULT_PATH as DEFAULT_XFAILS
from .xfails import load_xfails

#: Examples per property under Triton's interpreter (an interpreted layer call costs ~0.2-0.5 s).
INTERPRETER_MAX_EXAMPLES = 2
#: Examples per property elsewhere (every new shape compiles its kernels once on a GPU).
DEFAULT_MAX_EXAMPLES = 10


class CouldNotRun(GDNError):
    code = "gate_could_not_run"


@dataclass
class GateOptions:
    impl: str = "triton"
    device: str = "auto"
    profiles: tuple[str, ...] = VERIFY_PROFILES
    suite: str = "default"
    fixtures: str | None = None
    cases: list[str] | None = None
    tags: list[str] | None = None
    shard: tuple[int, int] | None = None
    out: str = "gdncheck-out/gate"
    junit: str | None = None
    report: str | None = None
    properties: bool = True
    property_names: list[str] | None = None
    max_examples: int | None = None
    hypothesis_profile: str | None = None
    shrink: bool = False
    jobs: int | None = None
    all_cases: bool = False
    rebuild_check: bool | None = None  # None: for the default suite only
    xfails: str | None = None  # known-failures file; None: the packaged one; "none": no known failures
    options: dict = field(default_factory=dict)
    fixtures_sha256: str | None = None  # the pinned sha256 of the suite's manifest.json


@dataclass
class GateResult:
    exit_code: int
    verdict: str
    reason: str | None
    doc: dict
    summaries: dict[str, Summary] = field(default_factory=dict)  # profile -> verify Summary
    known: dict = field(default_factory=dict)  # profile -> {case id: reason} (known failures)
    case_seconds: dict = field(default_factory=dict)  # profile -> {case id: seconds of its run}
    plan: Plan | None = None


@dataclass
class Setup:
    """What :func:`plan` decided, before anything runs."""

    fixtures: Path
    device: str
    interpreter: bool
    plan: Plan
    hypothesis_profile: str
    max_examples: int
    jobs: int
    xfails: list = field(default_factory=list)  # the known failures, read before anything runs
    #: the fixture check's rebuild, split over the workers (case ids per unit; none: not checked); run
    #: first, and the verdict waits for it: a drifted suite still fails the gate (exit 2)
    rebuild: list[list[str]] = field(default_factory=list)
    reached: list[str] = field(default_factory=list)  # the summary's sections before the fixture check
    suite_ids: list[str] = field(default_factory=list)  # the manifest's case ids, in its order


@dataclass
class Outcome:
    """What the workers returned: per (profile, case) the run's result, and every property result."""

    runs: dict[tuple[str, str], dict] = field(default_factory=dict)
    properties: list[dict] = field(default_factory=list)
    #: profile -> (its verify Summary, the verify summary's path): verified in the parent as soon as
    #: the profile's last case ran (the workers run on), else by judge
    verified: dict[str, tuple[Summary, Path]] = field(default_factory=dict)

    def seconds(self, profile: str) -> dict[str, float]:
        return {case: r["seconds"] for (p, case), r in self.runs.items() if p == profile}


def fixtures_path(opts: GateOptions) -> Path:
    """The fixture folder the options name (``--fixtures``, else the suite's), whether or not it is there."""
    if opts.fixtures:
        return Path(opts.fixtures)
    return DEFAULT_DIR if opts.suite == "default" else Path(f"fixtures-{opts.suite}")


def resolve_fixtures(opts: GateOptions) -> Path:
    path = fixtures_path(opts)
    if not (path / MANIFEST_NAME).is_file():
        hint = (f"build it first: gdncheck fixtures build --suite {opts.suite} --out {path} --jobs 2"
                if opts.suite != "default" else "give --fixtures DIR")
        raise CouldNotRun(f"expected a fixture folder with {MANIFEST_NAME} at {path}, found none; {hint}")
    return path


def resolve_device(opts: GateOptions) -> tuple[str, bool]:
    """(device, interpreter): ``auto`` is cuda when torch sees a GPU; the Triton path on the CPU runs
    in Triton's interpreter."""
    try:
        import torch

        cuda = bool(torch.cuda.is_available())
    except ImportError:
        cuda = False
    device = opts.device
    if device == "auto":
        device = "cuda" if cuda else "cpu"
    if device == "cuda" and not cuda:
        raise CouldNotRun("--device cuda was asked for, but torch sees no CUDA device here")
    if device not in ("cpu", "cuda"):
        raise CouldNotRun(f"expected --device auto, cpu or cuda, found {device!r}")
    return device, opts.impl == "triton" and device == "cpu"


def check_fixtures(fixtures: Path, suite_check: bool, pinned: str | None = None) -> tuple[dict, dict]:
    """The manifest against ``pinned`` (its sha256, when given), schema and consistency, checksums and
    (``suite_check``) a rebuild; raises :class:`CouldNotRun` on drift. Returns (what was checked, the
    manifest)."""
    problems: list[CaseProblem] = []
    try:
        if pinned is not None:
            check_manifest_sha256(fixtures, pinned)
        manifest = load_manifest(fixtures, problems)
    except FixtureError as exc:
        raise CouldNotRun(f"fixtures unusable: {exc}") from None
    bad = [f"{p.case}: {p.message}" for p in problems]
    for entry in manifest["cases"]:
        try:
            case_file(fixtures, entry)
        except FixtureError as exc:
            bad.append(str(exc))
    if bad:
        raise CouldNotRun("fixtures drifted (refusing to judge against them): " + "; ".join(bad[:5])
                          + (f"; and {len(bad) - 5} more" if len(bad) > 5 else ""))
    info = {"dir": str(fixtures), "suite": manifest["suite"], "cases": len(manifest["cases"]),
            "manifest_sha256": sha256_file(fixtures / "manifest.json"), "checksums": "ok", "rebuild": "not checked",
            "manifest_pinned": pinned is not None}
    if suite_check:
        info["rebuild"] = rebuild_verdict(check_suite(fixtures))
    return info, manifest


def rebuild_verdict(report: list[dict]) -> str:
    """The ``rebuild`` line of the fixture check from :func:`check_suite`'s report; raises
    :class:`CouldNotRun` when a case drifted from its generator (changed or missing)."""
    changed = [r for r in report if r["status"] in ("changed", "missing")]
    if changed:
        raise CouldNotRun("fixtures drifted from their generator (gdncheck fixtures check): "
                          + "; ".join(f"{r['id']}: {r['status']} ({r['detail']})" for r in changed[:5])
                          + "; rebuild with gdncheck fixtures build and review the diff")
    near = sum(r["status"] == "numerically-equal" for r in report)
    return "identical" if not near else f"identical ({near} numerically equal: another BLAS or CPU)"


def split_rebuild(manifest: dict, parts: int) -> list[list[str]]:
    """The suite's case ids in ``parts`` groups of about equal rebuild cost (layer calls; the longest
    first, each to the lightest group), each group in manifest order."""
    order = {e["id"]: i for i, e in enumerate(manifest["cases"])}
    groups: list[list[str]] = [[] for _ in range(max(1, parts))]
    load = [0.0] * len(groups)
    for e in sorted(manifest["cases"], key=lambda e: -(1 + call_count(e))):
        k = load.index(min(load))
        groups[k].append(e["id"])
        load[k] += 1 + call_count(e)
    return [sorted(g, key=order.__getitem__) for g in groups if g]


def run_gate(opts: GateOptions, progress: Callable[[float, float, dict], None] | None = None) -> GateResult:
    """Run the gate; never raises for a verdict (``CouldNotRun`` becomes exit 2 with its reason)."""
    start = time.perf_counter()
    out = Path(opts.out)
    result = GateResult(2, VERDICTS[2], None, gs.head(opts.impl, opts.options, out))
    # before anything is written: OUT is no fixture suite, inside none and around none (this one raises:
    # not even the gate's summary may be written there), and no earlier verdict survives this run
    refuse_output_in_suite(out, fixtures_path(opts))
    # OUT's own files and --junit: absent or the gate's (never a user's file); the same check as a merge's
    refuse_gate_writes(out, fixtures=fixtures_path(opts), junit=opts.junit)
    with folder_lock(out, "gate --out"):  # one writer per folder: a second gate into OUT is refused
        return _run_gate(opts, out, result, start, progress)


def _run_gate(opts: GateOptions, out: Path, result: GateResult, start: float, progress) -> GateResult:
    remove_stale(out / "gate-summary.json", out / "gate-junit.xml", *([Path(opts.junit)] if opts.junit else []))
    try:
        setup = plan(opts, result)
        outcome = execute(opts, out, setup, result.doc, progress)
        judge(opts, out, setup, outcome, result)
        summarise(opts, setup, outcome, result)
    except (CouldNotRun, FolderError) as exc:
        result.reason = result.doc["reason"] = safe_text(exc)
        result.exit_code = 2
    doc = result.doc
    doc["exit_code"], doc["verdict"] = result.exit_code, VERDICTS[result.exit_code]
    result.verdict = doc["verdict"]
    doc.setdefault("timing", {})["total_s"] = round(time.perf_counter() - start, 2)
    _write(opts, out, result)
    return result


def plan(opts: GateOptions, result: GateResult) -> Setup:
    """Validate the options, resolve the device and the fixtures, check them, choose the units."""
    doc = result.doc
    bad = [p for p in opts.profiles if p not in VERIFY_PROFILES]
    if bad or not opts.profiles:
        raise CouldNotRun(f"expected profiles from {', '.join(VERIFY_PROFILES)}, found "
                          f"{', '.join(opts.profiles) or 'none'}")
    fixtures = resolve_fixtures(opts)
    out = Path(opts.out)
    for p in opts.profiles:  # checked now, emptied when the work starts: nothing of someone else's is lost
        check_owned(out / p, OUTPUTS_MARKER, f"the outputs folder of profile {p}")
    if opts.report:
        try:
            refuse_gate_report(opts.report, fixtures, out=out, profiles=opts.profiles)
        except WriteRefused as exc:
            raise CouldNotRun(str(exc)) from None
    device, interpreter = resolve_device(opts)
    doc["implementation"].update(device=device, interpreter=interpreter)
    try:
        factory = load_factory(opts.impl)
    except GDNError as exc:
        raise CouldNotRun(f"implementation {opts.impl!r} cannot be loaded: {exc}") from None
    try:
        check_options(factory, opts.options, opts.impl)
    except GDNError as exc:
        raise CouldNotRun(str(exc)) from None
    try:  # read now: an unusable file must not cost a whole run first
        xfails = [] if (opts.xfails or "").lower() == "none" else load_xfails(opts.xfails)
    except GDNError as exc:
        raise CouldNotRun(str(exc)) from None
    default_suite = opts.suite == "default" and not opts.fixtures
    rebuild = opts.rebuild_check if opts.rebuild_check is not None else default_suite
    reached = list(doc)
    # checksums now (every case file the workers read is the manifest's); the rebuild runs in the
    # workers, first, beside the cases (execute): the verdict waits for it
    doc["fixtures"], manifest = check_fixtures(fixtures, False, opts.fixtures_sha256)
    if not default_suite and opts.fixtures_sha256 is None:
        doc.setdefault("notes", []).append(
            f"the manifest of {fixtures} is not pinned: its case files match it, but nothing says it is the suite you "
            f"meant; pin it with --fixtures-sha256 {doc['fixtures']['manifest_sha256']}")
    result.plan = _units(opts, manifest, interpreter)
    setup = Setup(fixtures, device, interpreter, result.plan,
                  hypothesis_profile=opts.hypothesis_profile or os.environ.get("GDN_HYPOTHESIS_PROFILE") or "ci",
                  max_examples=opts.max_examples or (INTERPRETER_MAX_EXAMPLES if interpreter else DEFAULT_MAX_EXAMPLES),
                  jobs=opts.jobs or (min(2, os.cpu_count() or 1) if device == "cpu" else 1), xfails=xfails,
                  reached=reached, suite_ids=[e["id"] for e in manifest["cases"]])
    if rebuild:
        setup.rebuild = split_rebuild(manifest, setup.jobs)
    p = result.plan
    doc["selection"] = {"profiles": list(opts.profiles), "shard": list(opts.shard) if opts.shard else None,
                        "cases": opts.cases, "tags": opts.tags, "selected": p.selected, "run": len(p.entries),
                        "skipped": [s.to_json() for s in p.skipped]}
    doc["properties"] = {"hypothesis_profile": setup.hypothesis_profile, "max_examples": setup.max_examples,
                         "shrink": opts.shrink, "units": len(p.property_units), "results": []}
    return setup


def _units(opts: GateOptions, manifest: dict, interpreter: bool) -> Plan:
    """The case units and property units of the selection (every profile)."""
    profiles = list(opts.profiles)
    try:
        entries, case_units, skipped, selected = plan_cases(manifest, profiles, cases=opts.cases, tags=opts.tags,
                                                            shard=opts.shard, interpreter=interpreter,
                                                            all_cases=opts.all_cases)
    except GDNError as exc:  # a selection of no case (a usage error: nothing would be judged)
        raise CouldNotRun(str(exc)) from None
    names = [n for n in PROPERTIES if not opts.property_names or any(k in n for k in opts.property_names)]
    prop_units = plan_properties(names, profiles, opts.shard, {n for n in names if PROPERTIES[n].once}) \
        if opts.properties else []
    return Plan(entries, case_units, prop_units, skipped, selected)


def execute(opts: GateOptions, out: Path, setup: Setup, doc: dict, progress) -> Outcome:
    """Run every unit in the workers (cases write their outputs under ``OUT/PROFILE/``)."""
    for p in opts.profiles:  # no outputs file of an earlier run is ever judged as this run's
        fresh(out / p, OUTPUTS_MARKER, f"the outputs folder of profile {p}")
    commands = {p: default_command(opts.impl, setup.fixtures, out / p, p, opts.options, False) for p in opts.profiles}
    # the order: the fixture rebuild; each profile's cases in turn, most expensive first, so that a
    # profile is verified here while the workers run the next; the properties last, most expensive
    # first (many small units: they even out the workers' ends)
    rank = {p: i for i, p in enumerate(opts.profiles)}
    first: list[Task] = [(run_rebuild_unit, (str(setup.fixtures), ids), 0.0) for ids in setup.rebuild]
    first += [(run_case_unit, (opts.impl, str(setup.fixtures), str(out), u, opts.options, commands[u.profile]), u.cost)
              for u in sorted(setup.plan.case_units, key=lambda u: (rank[u.profile], -u.cost))]
    first += [(run_property_unit, (opts.impl, u, setup.max_examples, setup.hypothesis_profile, opts.shrink), u.cost)
              for u in sorted(setup.plan.property_units, key=lambda u: -u.cost)]
    total, done = sum(t[2] for t in first if t[0] is not run_rebuild_unit), 0.0
    outcome = Outcome()
    start = time.perf_counter()
    env = {"GDN_DEVICE": setup.device, "GDN_HYPOTHESIS_PROFILE": setup.hypothesis_profile}
    rebuilt: list[dict] = []
    left = {p: sum(u.profile == p for u in setup.plan.case_units) for p in opts.profiles}
    for cost, res in execute_tasks([], setup.jobs, env, first):
        if res["kind"] == "rebuild":
            rebuilt.append(res)
            if len(rebuilt) == len(setup.rebuild):
                _rebuild_checked(setup, doc, rebuilt)
        else:
            done += cost
            if res["kind"] == "case":
                outcome.runs[(res["profile"], res["case"])] = res
                left[res["profile"]] -= 1
            else:
                outcome.properties.append(res)
            if progress:
                progress(done, total, res)
        if len(rebuilt) == len(setup.rebuild):  # the suite checked: verify each profile whose cases all ran
            for p in [p for p, n in left.items() if n == 0 and p not in outcome.verified and setup.plan.case_ids]:
                outcome.verified[p] = _verify_profile(opts, out, setup, p)
    if len(rebuilt) != len(setup.rebuild):  # never judged against a suite whose check did not finish
        raise CouldNotRun(f"the fixture check's rebuild reported {len(rebuilt)} of {len(setup.rebuild)} parts")
    doc["timing"] = {"jobs": setup.jobs, "work_s": round(time.perf_counter() - start, 2),
                     "cases_s": round(sum(r["seconds"] for r in outcome.runs.values()), 2),
                     "properties_s": round(sum(p["seconds"] for p in outcome.properties), 2)}
    return outcome


def _rebuild_checked(setup: Setup, doc: dict, results: list[dict]) -> None:
    """Every rebuild unit is in: the rebuild line of the fixtures section, or :class:`CouldNotRun` with
    the summary as a drifted suite leaves it (the sections before the fixture check only)."""
    order = {i: k for k, i in enumerate(setup.suite_ids)}
    report = sorted((r for res in results for r in res["report"]), key=lambda r: order.get(r["id"], len(order)))
    try:
        errors = [res["error"] for res in results if res["error"]]
        if errors:
            raise CouldNotRun(f"fixtures unusable: {errors[0]}")
        doc["fixtures"]["rebuild"] = rebuild_verdict(report)
    except CouldNotRun:
        for key in [k for k in doc if k not in setup.reached]:
            del doc[key]
        raise


def xfails_file(opts: GateOptions) -> str:
    return "none" if (opts.xfails or "").lower() == "none" else str(opts.xfails or DEFAULT_XFAILS)


def _verify_profile(opts: GateOptions, out: Path, setup: Setup, p: str) -> tuple[Summary, Path]:
    """Verify one profile's outputs (its known failures judged by verify: one rule for verify, the gate
    and the pytest plugin) and write its verify summary."""
    try:
        summary = verify(setup.fixtures, out / p, p, cases=setup.plan.case_ids,
                         diagnose=mutant_diagnoser(setup.fixtures), xfails=setup.xfails)
    except GDNError as exc:
        raise CouldNotRun(f"verify of profile {p} could not run: {exc}") from None
    summary.xfails["file"] = xfails_file(opts)
    return summary, summary.write(out / p / f"verify-summary-{p}.json")


def judge(opts: GateOptions, out: Path, setup: Setup, outcome: Outcome, result: GateResult) -> None:
    """Verify every profile's outputs and set the known failures (xfails) apart."""
    doc = result.doc
    ids = setup.plan.case_ids
    doc["profiles"] = {}
    doc["xfails"] = {"file": xfails_file(opts), "stale": [], "refused": []}
    unmatched: list[list[dict]] = []
    for p in opts.profiles:
        if not ids:
            doc["profiles"][p] = gs.nothing_to_verify()
            continue
        summary, path = outcome.verified.get(p) or _verify_profile(opts, out, setup, p)
        result.summaries[p] = summary
        result.known[p] = {c: k["reason"] for c, k in summary.known_failures().items()}
        result.case_seconds[p] = outcome.seconds(p)
        doc["xfails"]["stale"] += [{**x, "profile_run": p} for x in summary.xfails["stale"]]
        doc["xfails"]["refused"] += [{**x, "profile_run": p} for x in summary.xfails["refused"]]
        unmatched.append(summary.xfails["unmatched"])
        doc["profiles"][p] = gs.profile_section(summary, path, sum(result.case_seconds[p].values()))
    doc["xfails"]["unmatched"] = _unmatched_everywhere(unmatched, opts.profiles) if unmatched else []


def _unmatched_everywhere(per_profile: list[list[dict]], profiles) -> list[dict]:
    """The known-failure entries that matched no case in any profile of the run (a profile's list: its
    verify summary's ``xfails.unmatched``), with why."""
    lines = set.intersection(*({x["line"] for x in found} for found in per_profile))
    out = []
    for x in per_profile[0]:
        if x["line"] in lines:
            why = f"profile {x['profile']}; this run's: {', '.join(profiles)}" if x["why"].startswith("profile ") \
                else x["why"]
            out.append({**x, "why": why})
    return out


def summarise(opts: GateOptions, setup: Setup, outcome: Outcome, result: GateResult) -> None:
    """Property results, the implementation's name, the environment, and the exit code with its reason."""
    doc = result.doc
    props = sorted(outcome.properties, key=lambda r: (r["name"], VERIFY_PROFILES.index(r["profile"])))
    doc["properties"]["results"] = props
    doc["properties"]["totals"] = gs.property_totals(props)
    doc["implementation"]["name"] = next((v.get("implementation") for v in doc["profiles"].values()
                                          if v.get("implementation")), opts.impl)
    doc["environment"] = gs.environment(setup.device)
    worst = max([v["exit_code"] for v in doc["profiles"].values()] + [int(doc["properties"]["totals"]["fail"] > 0)])
    if worst == 2:  # counted per profile, as the rows of the table are
        result.reason = doc["reason"] = gs.could_not_judge_reason(doc)
    result.exit_code = worst


def _write(opts: GateOptions, out: Path, result: GateResult) -> None:
    """gate-summary.json, the JUnit XML (OUT/gate-junit.xml and --junit) and the --report folder."""
    doc = result.doc
    out.mkdir(parents=True, exist_ok=True)
    junit_paths = [out / "gate-junit.xml"] + ([Path(opts.junit)] if opts.junit else [])
    doc["outputs"].update(summary=str(out / "gate-summary.json"), junit=[str(p) for p in junit_paths],
                          report=opts.report)
    xml = gate_junit(doc, result.summaries, result.known, result.case_seconds)
    for p in junit_paths:
        xml.write(p)
    if opts.report:
        try:
            doc["outputs"]["report_files"] = [str(p) for p in write_report(Path(opts.report), doc, result.summaries)]
        except FolderError as exc:  # refused before the work; the reason says so already
            doc.setdefault("notes", []).append(f"no report written: {safe_text(exc)}")
    gs.write_summary(out, doc)


__all__ = ["SCHEMA_PATH", "CouldNotRun", "GateOptions", "GateResult", "run_gate", "validate_gate_summary"]
