"""``gdncheck gate``: decide whether an implementation conforms, in one call (the CI gate).

:func:`run_gate` is the library entry point the command wraps:

1. check the fixtures: the manifest against its schema, every case file against its sha256 and,
   for the committed default suite, a rebuild in memory (``fixtures check``); drifted fixtures are
   refused (exit 2, with why);
2. run the implementation over the selected cases in every profile (``run_impl``, one outputs file
   per case under ``OUT/PROFILE/``), in worker processes;
3. verify each profile (``verify``: ``OUT/PROFILE/verify-summary-PROFILE.json``);
4. search the property suite (:mod:`.properties`) against the same implementation, every profile;
5. write the gate summary (``OUT/gate-summary.json``), JUnit XML and the report.

Exit status (``GateResult.exit_code``): 0 conforms, 1 does not conform (a case or a property
fails), 2 could not run (``reason`` says why: drifted fixtures, an implementation that cannot be
loaded, a device that is not there, a case whose inputs are unusable).
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gdncheck._version import __version__
from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.ports.plugin import load_factory
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
    load_manifest,
    sha256_file,
)
from gdncheck.profiles import VERIFY_PROFILES
from gdncheck.reports.junit import JUnit, add_verify_summary
from gdncheck.safetensors_io import write_bytes_atomic

from .plan import Plan, Skip, plan_cases, plan_properties
from .report import write_report
from .workers import execute, run_case_unit, run_property_unit
from .xfails import DEFAULT_PATH as DEFAULT_XFAILS
from .xfails import classify, load_xfails

SCHEMA = "gdncheck-gate-summary"
SCHEMA_VERSION = 1
#: JSON Schema (draft 2020-12) of OUT/gate-summary.json
SCHEMA_PATH = Path(__file__).with_name("gate_summary.schema.json")


def validate_gate_summary(doc: dict) -> None:
    """Raise ``jsonschema.ValidationError`` if ``doc`` breaks the gate-summary schema."""
    import jsonschema  # only a caller that validates needs it

    jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text())).validate(doc)
PROFILES = VERIFY_PROFILES
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
    profiles: tuple[str, ...] = PROFILES
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


@dataclass
class GateResult:
    exit_code: int
    verdict: str
    reason: str | None
    doc: dict
    summaries: dict = field(default_factory=dict)  # profile -> verify Summary
    known: dict = field(default_factory=dict)  # profile -> {case id: reason} (known failures)
    case_seconds: dict = field(default_factory=dict)  # profile -> {case id: seconds of its run}
    plan: Plan | None = None


VERDICTS = {0: "conforms", 1: "does not conform", 2: "could not run"}


def resolve_fixtures(opts: GateOptions) -> Path:
    if opts.fixtures:
        path = Path(opts.fixtures)
    else:
        path = DEFAULT_DIR if opts.suite == "default" else Path(f"fixtures-{opts.suite}")
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


def check_fixtures(fixtures: Path, suite_check: bool) -> tuple[dict, dict]:
    """Schema, checksums and (``suite_check``) a rebuild; raises :class:`CouldNotRun` on drift.
    Returns (what was checked, the manifest)."""
    problems: list[CaseProblem] = []
    try:
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
            "manifest_sha256": sha256_file(fixtures / "manifest.json"), "checksums": "ok", "rebuild": "not checked"}
    if suite_check:
        report = check_suite(fixtures)
        changed = [r for r in report if r["status"] in ("changed", "missing")]
        if changed:
            raise CouldNotRun("fixtures drifted from their generator (gdncheck fixtures check): "
                              + "; ".join(f"{r['id']}: {r['status']} ({r['detail']})" for r in changed[:5])
                              + "; rebuild with gdncheck fixtures build and review the diff")
        near = sum(r["status"] == "numerically-equal" for r in report)
        info["rebuild"] = "identical" if not near else f"identical ({near} numerically equal: another BLAS or CPU)"
    return info, manifest


def _environment(device: str) -> dict:
    env = {"python": platform.python_version(), "platform": platform.platform()}
    try:
        import torch
        import triton

        env.update(torch=torch.__version__, triton=triton.__version__)
        if device == "cuda":
            env["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return env


def run_gate(opts: GateOptions, progress: Callable[[float, float, dict], None] | None = None) -> GateResult:
    """Run the gate; never raises for a verdict (``CouldNotRun`` becomes exit 2 with its reason)."""
    start = time.perf_counter()
    out = Path(opts.out)
    doc: dict = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION,
                 "tool": {"name": "gdncheck", "version": __version__},
                 "verdict": None, "exit_code": None, "reason": None,
                 "implementation": {"spec": opts.impl, "options": opts.options}, "outputs": {"dir": str(out)}}
    result = GateResult(2, VERDICTS[2], None, doc)
    try:
        _run(opts, out, doc, result, progress)
    except CouldNotRun as exc:
        result.reason = doc["reason"] = str(exc)
        result.exit_code = 2
    doc["exit_code"], doc["verdict"] = result.exit_code, VERDICTS[result.exit_code]
    result.verdict = doc["verdict"]
    doc.setdefault("timing", {})["total_s"] = round(time.perf_counter() - start, 2)
    _write(opts, out, doc, result)
    return result


def _run(opts: GateOptions, out: Path, doc: dict, result: GateResult, progress) -> None:
    bad = [p for p in opts.profiles if p not in PROFILES]
    if bad or not opts.profiles:
        raise CouldNotRun(f"expected profiles from {', '.join(PROFILES)}, found {', '.join(opts.profiles) or 'none'}")
    fixtures = resolve_fixtures(opts)
    device, interpreter = resolve_device(opts)
    doc["implementation"].update(device=device, interpreter=interpreter)
    try:
        load_factory(opts.impl)
    except GDNError as exc:
        raise CouldNotRun(f"implementation {opts.impl!r} cannot be loaded: {exc}") from None
    rebuild = opts.rebuild_check if opts.rebuild_check is not None else opts.suite == "default" and not opts.fixtures
    doc["fixtures"], manifest = check_fixtures(fixtures, rebuild)
    profiles = list(opts.profiles)
    try:
        entries, case_units, skipped, selected = plan_cases(manifest, profiles, cases=opts.cases, tags=opts.tags,
                                                            shard=opts.shard, interpreter=interpreter,
                                                            all_cases=opts.all_cases)
    except GDNError as exc:
        raise CouldNotRun(str(exc)) from None
    names = [n for n in PROPERTIES if not opts.property_names or any(k in n for k in opts.property_names)]
    prop_units = plan_properties(names, profiles, opts.shard, {n for n in names if PROPERTIES[n].once}) \
        if opts.properties else []
    result.plan = Plan(entries, case_units, prop_units, skipped, selected)
    hyp = opts.hypothesis_profile or os.environ.get("GDN_HYPOTHESIS_PROFILE") or "ci"
    max_examples = opts.max_examples or (INTERPRETER_MAX_EXAMPLES if interpreter else DEFAULT_MAX_EXAMPLES)
    jobs = opts.jobs or (min(2, os.cpu_count() or 1) if device == "cpu" else 1)
    doc["selection"] = {"profiles": profiles, "shard": list(opts.shard) if opts.shard else None, "cases": opts.cases,
                        "tags": opts.tags, "selected": selected, "run": len(entries),
                        "skipped": [s.to_json() for s in skipped]}
    doc["properties"] = {"hypothesis_profile": hyp, "max_examples": max_examples, "shrink": opts.shrink,
                         "units": len(prop_units), "results": []}
    env = {"GDN_DEVICE": device, "GDN_HYPOTHESIS_PROFILE": hyp}
    commands = {p: default_command(opts.impl, fixtures, out / p, p, opts.options, False) for p in profiles}
    tasks = [(run_case_unit, (opts.impl, str(fixtures), str(out), u, opts.options, commands[u.profile]), u.cost)
             for u in case_units]
    tasks += [(run_property_unit, (opts.impl, u, max_examples, hyp, opts.shrink), u.cost) for u in prop_units]
    total = sum(t[2] for t in tasks)
    done = 0.0
    runs: dict[tuple[str, str], dict] = {}
    props: list[dict] = []
    t_run = time.perf_counter()
    for cost, res in execute(tasks, jobs, env):
        done += cost
        if res["kind"] == "case":
            runs[(res["profile"], res["case"])] = res
        else:
            props.append(res)
        if progress:
            progress(done, total, res)
    doc["timing"] = {"jobs": jobs, "work_s": round(time.perf_counter() - t_run, 2),
                     "cases_s": round(sum(r["seconds"] for r in runs.values()), 2),
                     "properties_s": round(sum(p["seconds"] for p in props), 2)}
    ids = [e["id"] for e in entries]
    worst = 0
    doc["profiles"] = {}
    xfails = [] if (opts.xfails or "").lower() == "none" else load_xfails(opts.xfails)
    doc["xfails"] = {"file": "none" if (opts.xfails or "").lower() == "none" else str(opts.xfails or DEFAULT_XFAILS),
                     "stale": []}
    for p in profiles:
        if not ids:
            doc["profiles"][p] = {"verdict": "nothing to verify", "exit_code": 0, "totals": {}, "failures": [],
                                  "known_failures": []}
            continue
        summary = verify(fixtures, out / p, p, cases=ids)
        path = summary.write(out / p / f"verify-summary-{p}.json")
        result.summaries[p] = summary
        known, stale = classify(xfails, opts.impl, p, summary.cases)
        result.known[p] = {c: x.reason for c, x in known.items()}
        result.case_seconds[p] = {c: r["seconds"] for (pp, c), r in runs.items() if pp == p}
        doc["xfails"]["stale"] += [{**x.to_json(), "profile_run": p} for x in stale]
        code = 2 if any(c.status == "error" for c in summary.cases) else \
            int(any(c.status == "fail" and c.id not in known for c in summary.cases))
        worst = max(worst, code)
        doc["profiles"][p] = {
            "verdict": VERDICTS[code] if code != 2 else summary.verdict(), "exit_code": code,
            "totals": summary.totals(), "summary": str(path), "implementation": summary.implementation.get("name"),
            "seconds": round(sum(r["seconds"] for (pp, _), r in runs.items() if pp == p), 2),
            "failures": [{"case": c.id, "status": c.status,
                          "first_divergence": c.first_divergence and c.first_divergence.to_json(),
                          "message": c.message or c.problem, "repro": c.repro}
                         for c in summary.cases if c.status in ("fail", "error") and c.id not in known],
            "not_applicable": [{"case": c.id, "reason": (c.not_applicable or {}).get("reason") or c.message}
                               for c in summary.cases if c.status == "not_applicable"],
            "known_failures": [{"case": c.id, "tensors": sorted({r.tensor for r in c.records if r.verdict == "fail"}),
                                "reason": known[c.id].reason, "xfails_line": known[c.id].line,
                                "message": c.message} for c in summary.cases if c.id in known]}
    props.sort(key=lambda r: (r["name"], PROFILES.index(r["profile"])))
    doc["properties"]["results"] = props
    doc["properties"]["totals"] = {s: sum(r["status"] == s for r in props) for s in ("pass", "fail", "skip")}
    if any(r["status"] == "fail" for r in props):
        worst = max(worst, 1)
    doc["implementation"]["name"] = next((v.get("implementation") for v in doc["profiles"].values()
                                          if v.get("implementation")), opts.impl)
    doc["environment"] = _environment(device)
    if worst == 2:
        unusable = [f["case"] for v in doc["profiles"].values() for f in v["failures"] if f["status"] == "error"]
        result.reason = doc["reason"] = (f"inputs unusable for {len(unusable)} case(s): "
                                         f"{', '.join(sorted(set(unusable)))}")
    result.exit_code = worst


def _write(opts: GateOptions, out: Path, doc: dict, result: GateResult) -> None:
    out.mkdir(parents=True, exist_ok=True)
    junit_paths = [out / "gate-junit.xml"] + ([Path(opts.junit)] if opts.junit else [])
    doc["outputs"].update(summary=str(out / "gate-summary.json"), junit=[str(p) for p in junit_paths],
                          report=opts.report)
    xml = gate_junit(doc, result)
    for p in junit_paths:
        xml.write(p)
    if opts.report:
        doc["outputs"]["report_files"] = [str(p) for p in write_report(Path(opts.report), doc, result.summaries)]
    write_bytes_atomic(out / "gate-summary.json", (json.dumps(doc, indent=1, default=str) + "\n").encode())


def gate_junit(doc: dict, result: GateResult) -> JUnit:
    """The gate's JUnit document: fixtures check, every profile's cases by stage group, properties."""
    junit = JUnit("gdncheck gate")
    fx = doc.get("fixtures")
    if doc["exit_code"] == 2 and doc.get("reason") and not result.summaries:
        junit.case("gate", "gate", "setup", error=(doc["reason"], doc["reason"]))
    if fx:
        junit.case("fixtures", "fixtures", "checksums", output=f"{fx['cases']} case files match the manifest")
        if fx["rebuild"] == "not checked":
            junit.case("fixtures", "fixtures", "rebuild", skipped="not checked (a suite other than the committed one)")
        else:
            junit.case("fixtures", "fixtures", "rebuild", output=fx["rebuild"])
    skipped = [Skip(**s) for s in (doc.get("selection") or {}).get("skipped", [])]
    for p, summary in result.summaries.items():
        add_verify_summary(junit, summary, skipped=skipped, known=result.known.get(p),
                           case_seconds=result.case_seconds.get(p))
    for r in (doc.get("properties") or {}).get("results", []):
        suite, cls = f"properties.{r['profile']}", f"properties.{r['profile']}.{r['chapter']}"
        if r["status"] == "fail":
            text = "\n".join([r["message"], *r["notes"], f"blob: {r['blob']}", f"replay: {r['replay']}"])
            junit.case(suite, cls, r["name"], seconds=r["seconds"],
                       failure=(r["message"].splitlines()[0] if r["message"] else "property failed", "property", text))
        elif r["status"] == "skip":
            junit.case(suite, cls, r["name"], seconds=r["seconds"], skipped=r["message"])
        else:
            junit.case(suite, cls, r["name"], seconds=r["seconds"], output=f"{r['examples']} example(s)")
    return junit
