"""``gdncheck verify``: judge a port's outputs against the golden fixtures."""

from __future__ import annotations

import argparse
from pathlib import Path

from gdncheck.profiles import VERIFY_PROFILES

from .console import Console, add_output_arguments

DESCRIPTION = """\
Verify a port's outputs (fixtures/FORMAT.md §7) against the goldens, per case, call and stage
tensor, with the tolerances earned for the profile (docs/tolerances.md). Prints each case's
verdict and, for a failing case, the first divergence (call, stage, tensor, token) and a repro
line; writes a JSON summary (docs/verify.md).

Exit status: 0 every case conforms, 1 some case does not, 2 some case's inputs were unusable
(missing, truncated or damaged files, a checksum that does not match the manifest, a file name
outside its folder; every other case is still verified), nothing was judged, or the command could
not start (a selection of no case, a bad path).

Coverage (fixtures/FORMAT.md §2): a case that needs no optional feature must be judged (declaring it
not applicable fails it), a case that judged no tensor is no pass, and a run that judged nothing
never exits 0. An earlier summary at the same path is removed before anything runs, so a run that
stops early leaves no stale verdict behind; --summary and --junit never replace a file gdncheck did
not make. verify only reads --outputs (a reader's lock: verifies of one folder run side by side, a
run into it is refused); a read-only folder is judged with --summary elsewhere or '-'.

A failing port reads from the top: passing cases stream by as they are judged (-q drops them);
then the failing cases in groups (how many first diverge at each stage and tensor, how many have
each likely cause), one line per failing case, and the full text (message, repro line, likely
cause) of the first --details N of them. --max-fail N (-x: 1) stops judging after N failing
cases; the summary says so (stopped_early) and the verdict stays "does not conform". Colour only
on a terminal, never with NO_COLOR set.

Known failures (--xfails FILE, the format of the gate's gate/xfails.txt: IMPL PROFILE CASE WHAT
# reason; docs/verify.md): a case that fails only where an entry allows (its tensors or stages)
is printed "xfail" with the entry's reason and does not make the exit status 1; an entry whose
case passes now is stale, and one that matches no case of the run is listed: warnings (notes)
naming their lines, the exit status unchanged. A known failure never excuses a case the coverage
rule fails (a case every port must run declared not applicable), and a run passes only if a case
that judged tensors passed: one whose judged cases are known failures and expected errors (which
judge no tensor), or that judged no tensor at all (--tag error), never exits 0.

A bad manifest entry (one that breaks the schema, contradicts itself, or judges less than its case
file holds: fixtures/FORMAT.md §2, §4.1) is that case's error, one line naming it; every other case
is judged, and the exit status is 2 (as `gdncheck fixtures check` reports it)."""


def configure(p: argparse.ArgumentParser) -> None:
    from gdncheck.fixtures.manifest import DEFAULT_DIR

    p.add_argument("--fixtures", default=str(DEFAULT_DIR), help=f"fixture folder (default {DEFAULT_DIR})")
    p.add_argument("--outputs", required=True, help="the port's outputs folder")
    p.add_argument("--profile", required=True, choices=VERIFY_PROFILES, help="precision profile")
    p.add_argument("--stage-isolated", action="store_true", help="outputs of stages run alone from golden inputs")
    p.add_argument("--fused", action="store_true",
                   help="stage-isolated outputs of a fused kernel (one that computes several stages from one stage's "
                        "golden inputs), judged against the profile's end-to-end bounds (docs/verify.md, Fused "
                        "kernels); implies --stage-isolated")
    p.add_argument("--case", action="append", help="only this case (id or id prefix; repeatable)")
    p.add_argument("--tag", action="append", help="only cases with this tag (repeatable)")
    p.add_argument("--shard", help="I/N: every N-th selected case from the I-th (0-based)")
    p.add_argument("--tolerances", help="tolerance table (default: the packaged conformance/judge/tolerances.json, "
                                        "pinned by its sha256); one that loosens a shipped bound is refused unless "
                                        "--allow-looser-tolerances")
    p.add_argument("--allow-looser-tolerances", action="store_true",
                   help="judge with a --tolerances table that loosens shipped bounds; every verdict then says so")
    p.add_argument("--summary", help="where to write the JSON summary (default OUTPUTS/verify-summary-PROFILE.json; "
                                     "'-': to stdout, as --json)")
    p.add_argument("--junit", help="also write JUnit XML here (one testcase per case and stage; for CI publishers)")
    p.add_argument("--verbose", action="store_true", help="print every failing record, not only the first per case")
    p.add_argument("--names", metavar="TABLE",
                   help="read the port's own tensor names through a name table: hf, doppler, metrale or a JSON path "
                        "(docs/names.md)")
    p.add_argument("--report", metavar="DIR", help="also write the HTML diff report there (docs/report.md)")
    p.add_argument("--diagnose", type=case_count, default=8, metavar="N",
                   help="name the likely cause of the first N failing cases (default 8; 0: none): each runs every "
                        "known bug class on the case (docs/meta.md)")
    p.add_argument("--fixtures-sha256", metavar="SHA256",
                   help="refuse a fixture folder whose manifest.json has another sha256 (pin a vendored suite)")
    p.add_argument("--details", type=details_count, default=None, metavar="N|all",
                   help=f"print the full text (message, repro line, likely cause) of N failing cases: the first "
                        f"of each first-divergence group, then the next in order; every other failing case gets "
                        f"one line (default {DETAILS}, all with --verbose; 'all': every failing case)")
    p.add_argument("--max-fail", type=positive_count, default=None, metavar="N",
                   help="stop judging after N failing cases: the cases left are not judged, the summary says so "
                        "(stopped_early) and the verdict is 'does not conform' (exit 1; 2 if some inputs were "
                        "unusable), never a pass")
    p.add_argument("-x", dest="max_fail", action="store_const", const=1,
                   help="stop judging at the first failing case (--max-fail 1)")
    p.add_argument("--xfails", metavar="FILE",
                   help="known failures (IMPL PROFILE CASE WHAT  # reason, one a line; docs/verify.md): a case "
                        "failing only in the listed tensors or stages is a known failure, not exit 1; a listed "
                        "case that passes is reported stale (a warning)")
    add_output_arguments(p, json_what="the summary (also written to --summary's file unless that is '-')")


#: failing cases whose full text verify prints by default (the others: one line each)
DETAILS = 3


def details_count(text: str) -> int | str:
    """``--details``: a count (0 or more), or ``all``."""
    if text == "all":
        return "all"
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a number of cases (0 or more) or 'all', found {text!r}")
    return n


def case_count(text: str) -> int:
    """``--diagnose``: a number of cases, 0 or more."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a number of cases (0 or more), found {text!r}")
    return n


def positive_count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number of failing cases (1 or more), found {text!r}")
    return n


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gdncheck.commands.run import output_file
    from gdncheck.errors import GDNError
    from gdncheck.fixtures.manifest import refuse_output_in_suite
    from gdncheck.testing import case_text
    from gdncheck.untrusted import safe_text
    from gdncheck.writes import JUNIT_MARKS, VERIFY_SUMMARY_MARKS, refuse_write, refuse_write_into_suite

    to_file = args.summary != "-"  # '-': the summary goes to stdout only
    if not to_file:
        args.json = True
    con = Console(args)

    def say(text: str) -> None:
        con.say(safe_text(text, keep_newlines=True))

    failures = []  # failing cases: printed after judging, under their groups
    judged = [0]

    def progress(c):
        judged[0] += 1
        if c.status == "fail":
            failures.append(c)
        else:
            text = con.mark(safe_text(case_text(c), keep_newlines=True))  # port strings made visible
            (con.progress if c.status in ("pass", "not_applicable") else con.say)(text)
            for note in case_notes(c):
                con.progress(safe_text(f"      note: {safe_text(note)}", keep_newlines=True))
        con.status(f"judged {judged[0]} case(s)" + (f", {len(failures)} failing" if failures else ""))

    # every path checked, and the stale results removed, before anything is judged
    if getattr(args, "xfails", None):  # a malformed known-failures file: exit 2 before anything is touched
        from gdncheck.conformance.judge.xfails import load_xfails

        load_xfails(args.xfails)
    outputs = Path(args.outputs)
    if not outputs.is_dir():  # a typo would judge every case "no outputs file", and make the folder for the summary
        raise GDNError(f"--outputs {outputs}: expected the port's outputs folder, found "
                         + ("nothing" if not outputs.exists() else "a file"))
    path = output_file(Path(args.summary) if args.summary and to_file else
                       Path(args.outputs) / f"verify-summary-{args.profile}.json", "--summary")
    junit_path = output_file(args.junit, "--junit") if args.junit else None
    for target, flag in ((path if to_file else None, "--summary"), (junit_path, "--junit"), (args.report, "--report")):
        if target is not None:
            refuse_output_in_suite(Path(target).parent if flag != "--report" else target, None, flag)
    if to_file:  # never over a file gdncheck did not make: only an earlier summary is replaced (the default
        # name in the outputs folder is gdncheck's own: a run never writes it, FORMAT.md §7)
        if args.summary:
            refuse_write(path, "--summary", VERIFY_SUMMARY_MARKS, kind="a verify summary gdncheck wrote")
        writable_folder(path, "--summary", "or pass --summary elsewhere, or '-' for stdout")
    if junit_path is not None:
        refuse_write(junit_path, "--junit", JUNIT_MARKS, kind="a JUnit file gdncheck wrote")
        writable_folder(junit_path, "--junit")
    if args.report:  # refused now, not after the whole run
        from gdncheck.reports.site import check_report_folder

        refuse_write_into_suite(args.report, "--report", fixtures=args.fixtures)
        check_report_folder(args.report)
    from contextlib import ExitStack

    from gdncheck.conformance.ports.run import mixed_runs_message, runs_in
    from gdncheck.untrusted import folder_lock

    with ExitStack() as held:  # one writer per folder: the outputs folder (judged; the summary's) and --report's
        try:
            refuse_output_in_suite(outputs, None, "--outputs")
            in_suite = False
        except GDNError:  # a suite given as the outputs folder: only read, never written (not even a lock)
            in_suite = True
        if not in_suite:  # a reader's lock: verifies of one folder share it, a run into it is excluded
            held.enter_context(folder_lock(outputs, "--outputs", shared=True))
        if args.report:
            held.enter_context(folder_lock(args.report, "--report", beside=True))
        for stale in (path if to_file else None, junit_path):
            if stale is not None and stale.is_file():
                stale.unlink()
        runs = runs_in(outputs, gdncheck_runs_only=True)
        if len(runs) > 1:  # never a mix of runs judged as one
            raise GDNError(mixed_runs_message(outputs, runs))
        return _judge(args, con, say, path, junit_path, to_file, failures, progress)


def writable_folder(path, flag: str, hint: str = "") -> None:
    """Refuse (before anything is judged) a file to write whose folder exists but cannot be written
    (a read-only outputs folder holding the default summary): one line, not an error after the run."""
    import os

    from gdncheck.errors import GDNError

    folder = path.parent if str(path.parent) else Path(".")
    if folder.is_dir() and not os.access(folder, os.W_OK):
        raise GDNError(f"{flag} {path}: its folder {folder} is not writable (read-only); expected a path in a folder "
                       f"gdncheck may write" + (f" ({hint})" if hint else ""))


def _judge(args, con, say, path, junit_path, to_file, failures, progress) -> int:
    from gdncheck.commands.run import parse_shard
    from gdncheck.conformance.judge.verify import verify
    from gdncheck.untrusted import safe_text

    try:
        summary = verify(args.fixtures, args.outputs, args.profile, cases=args.case, tags=args.tag,
                         shard=parse_shard(args.shard), stage_isolated=args.stage_isolated, fused=args.fused,
                         tolerances=args.tolerances, progress=progress, names=args.names, diagnose=diagnoser(args),
                         manifest_sha256=args.fixtures_sha256, max_fail=args.max_fail,
                         allow_looser_tolerances=args.allow_looser_tolerances, xfails=getattr(args, "xfails", None))
    except KeyboardInterrupt:  # the failing cases held back so far are not lost with the run
        con.clear_status()
        for c in failures:
            con.say(con.mark(safe_text(f"FAIL  {c.id}: first divergence {c.first_divergence}")))
        raise
    finally:
        con.clear_status()
    doc = summary.to_json()
    stopped = summary.stopped_early
    if to_file:
        summary.write(path)
    if junit_path:
        from gdncheck.reports.junit import JUnit, add_verify_summary

        junit = JUnit("gdncheck verify")
        add_verify_summary(junit, summary, known={c: k["reason"] for c, k in summary.known_failures().items()})
        junit.write(junit_path)
    known = summary.known_failures()
    real = [c for c in failures if c.id not in known]
    if real:
        shown = {**doc, "cases": [{**c, "status": "known failure"} if c["id"] in known else c  # not grouped
                                  for c in doc["cases"]]} if known else doc
        for line in failure_lines(real, shown, args, con, path if to_file else None):
            con.say(line)
    if real:
        made_by = port_command_note(summary.implementation.get("command"))
        if made_by:
            say(made_by)
    for c in failures:
        if c.id in known:
            k = known[c.id]
            say(f"xfail {c.id}: known failure ({summary.xfails['file']}:{k['line']}: {k['reason']}); first "
                f"divergence {c.first_divergence}")
    for line in names_notes(summary.cases):
        say(line)
    t = summary.totals()
    for note in summary.notes:
        say(f"note: {safe_text(note)}")
    say(summary.coverage_line())
    early = (f"; stopped early after {stopped['max_fail']} failing case(s), {stopped['cases_not_judged']} case(s) "
             f"not judged" if stopped else "")
    looser = summary.tolerances.get("looser_bounds") or 0
    early += f"; with a tolerance table looser than the shipped one at {looser} bound(s)" if looser else ""
    fail = f"{t['failed'] - len(known)} fail" + (f", {len(known)} known failure(s)" if known else "")
    stale = len((summary.xfails or {}).get("stale", []))
    fail += f", {stale} stale known-failure entry(ies)" if stale else ""
    lost = len((summary.xfails or {}).get("unmatched", []))
    fail += f", {lost} known-failure entry(ies) matching no case" if lost else ""
    con.say(con.mark(safe_text(
        f"{summary.verdict()}: {t['passed']}/{t['cases']} cases pass, {fail}, {t['errors']} unusable, "
        f"{t['not_applicable']} not applicable; "
        f"{t['records'] - t['records_missing']} tensors judged, {t['records_failed']} failed, "
        f"{t['records_missing']} not provided{early} "
        f"[{safe_text(summary.implementation.get('name'))}, profile {args.profile}, {summary.mode_text()}]; summary: "
        f"{path if to_file else 'stdout'}")))
    if args.report:
        from gdncheck.reports import write_report

        index = write_report(doc, args.report, fixtures_dir=args.fixtures, outputs_dir=args.outputs)
        con.progress(safe_text(f"report: {index}"))
    con.emit_json(doc)
    return summary.exit_code


def port_command_note(command) -> str | None:
    """A note showing, as data, the command the outputs say made them when it is no ``gdncheck run``
    command the repro lines can repeat (a port's own runner, or anything else): quoted, on one line,
    never part of a repro."""
    from gdncheck.conformance.judge.messages import run_words
    from gdncheck.untrusted import one_line

    if not isinstance(command, str) or not command or run_words(command) is not None:
        return None
    return (f"note: the outputs say they were made by {one_line(command, 300)!r} (their command, shown as data: "
            f"not a gdncheck run command, so repro lines do not repeat it; rerun your port, then the repro)")


def failure_lines(failures: list, doc: dict, args: argparse.Namespace, con: Console, summary_path) -> list[str]:
    """The failing cases, after judging: their groups (first divergence, likely cause), then one line
    per case, the full text of the ``--details`` first (one per first-divergence group first)."""
    import os

    from gdncheck.untrusted import one_line, safe_text

    from .grouping import failure_groups

    try:
        groups = failure_groups(doc)
    except Exception as exc:  # noqa: BLE001 - the groups are a reading aid: never lose the cases and the verdict
        if os.environ.get("GDN_DEBUG"):
            raise
        groups = None
        problem = safe_text(f"(the failing cases could not be grouped: {type(exc).__name__}: {exc}; a gdncheck bug)")
    given = getattr(args, "details", None)  # None: not given (--verbose then means all)
    limit = None if given == "all" or (given is None and args.verbose) else DETAILS if given is None else given
    earliest = earliest_in_layer(failures)  # the failure most cases share leads (grouping.Groups.lead_case)
    shown = pick_details([c.id for c in failures], groups, limit,
                         earliest=groups.lead_case(earliest) if groups is not None else earliest)
    repro = Repro(args)
    lines = groups.lines() if groups is not None else [problem]
    # the cases printed in full first, in the order they were picked (the earliest in the layer first),
    # then the one-line cases in the suite's order
    order = {case: i for i, case in enumerate(shown)}
    for c in sorted(failures, key=lambda c: order.get(c.id, len(order))):
        lines.append(con.mark(safe_text(f"FAIL  {c.id}: first divergence {c.first_divergence}")))
        if c.id not in order:
            continue
        if c.message:
            lines.append(f"      {one_line(c.message)}")
        lines.append(f"      repro: {safe_text(repro(c))}")
        if c.diagnosis:
            lines.append(f"      likely cause: {safe_text(c.diagnosis.get('text'))}")
        if groups is not None and groups.aside(c.id):
            lines.append(f"      note: {safe_text(groups.aside(c.id))}")
        if args.verbose:
            lines += [f"      also: {safe_text(r.message)}" for r in c.records
                      if r.verdict == "fail" and r.message != c.message]
        if not args.quiet:
            lines += [f"      note: {safe_text(note)}" for note in case_notes(c)]
    hidden = len(failures) - len(shown)
    if hidden:
        where = f"; the summary {summary_path} holds every one" if summary_path else ""
        lines.append(safe_text(f"({hidden} failing case(s) on one line only: --details all prints each one's "
                               f"message, repro and likely cause{where})"))
    return lines


def case_notes(c) -> list[str]:
    """A case's notes as printed under it: those about the port's tensor names (a name table's, the
    same for most cases of a run) are said once for the run instead (:func:`names_notes`)."""
    from gdncheck.conformance.judge.aliases import is_names_note

    return [n for n in c.notes if not is_names_note(n)]


def names_notes(cases: list) -> list[str]:
    """Each distinct note about the port's tensor names once, with the number of cases it holds for."""
    from gdncheck.conformance.judge.aliases import is_names_note
    from gdncheck.untrusted import safe_text

    counts: dict[str, int] = {}
    for c in cases:
        for n in dict.fromkeys(c.notes):
            if is_names_note(n):
                counts[n] = counts.get(n, 0) + 1
    return [safe_text(f"note ({k} of {len(cases)} case(s)): {n}") for n, k in counts.items()]


def earliest_in_layer(failures: list) -> str | None:
    """The failing case whose first divergence is earliest in the layer (the stage's rank in the
    pipeline; the first such case of the suite): the one to read first, since a later stage may only
    show what an earlier one did (a case without a stage, one that raised, comes last)."""
    from gdncheck.stages import PIPELINE_ORDER, stage_rank

    def rank(c):
        stage = c.first_divergence.stage if c.first_divergence else None
        return stage_rank(stage) if stage in (*PIPELINE_ORDER, "state") else len(PIPELINE_ORDER) + 1

    return min(failures, key=rank).id if failures else None


def pick_details(failing: list[str], groups, limit: int | None, earliest: str | None = None) -> list[str]:
    """The failing cases whose full text is printed, in the order they are printed: ``earliest`` (the
    case whose first divergence is earliest in the layer) first, then the first case of each
    first-divergence group (most cases first), then the next cases in order, ``limit`` in all (None:
    every one, ``earliest`` first)."""
    if limit is None:
        return ([earliest] if earliest in failing else []) + [c for c in failing if c != earliest]
    picked: list[str] = [earliest] if earliest in failing and limit > 0 else []
    for g in groups.stages if groups is not None else []:
        if len(picked) < limit and g.cases and g.cases[0] not in picked:
            picked.append(g.cases[0])
    for case in failing:
        if len(picked) >= limit:
            break
        if case not in picked:
            picked.append(case)
    return picked


class Repro:
    """A failing case's repro line as the console prints it: the run that made its outputs (from the
    outputs' metadata) and this verify, with the paths as the user typed them (a relative path stays
    relative), the default fixture folder left out (it is the default), verify's own options
    (``--names``, ``--tolerances``) kept, and the case named by the shortest id prefix that selects it
    alone in the suite. The summary's ``repro`` field keeps the judge's full form."""

    def __init__(self, args: argparse.Namespace):
        from gdncheck.fixtures.manifest import DEFAULT_DIR

        self.args = args
        self.default = str(DEFAULT_DIR)
        self.ids = _suite_ids(args.fixtures)

    def _is_default(self, folder: str) -> bool:
        """``folder`` is the default suite as argparse fills it in (not typed: a typed path is kept)."""
        import os

        return os.path.normpath(str(folder)) == os.path.normpath(self.default)

    def case(self, case_id: str) -> str:
        """The shortest prefix of ``case_id`` at a ``_`` boundary that no other case of the suite starts with."""
        if not self.ids or case_id not in self.ids:
            return case_id
        parts = case_id.split("_")
        for k in range(1, len(parts)):
            prefix = "_".join(parts[:k])
            if sum(i.startswith(prefix) for i in self.ids) == 1:
                return prefix
        return case_id

    def verify_command(self, case: str) -> list[str]:
        a = self.args
        cmd = ["gdncheck", "verify"]
        if not self._is_default(a.fixtures):
            cmd += ["--fixtures", a.fixtures]
        cmd += ["--outputs", a.outputs, "--profile", a.profile]
        cmd += ["--fused"] if a.fused else ["--stage-isolated"] if a.stage_isolated else []
        cmd += ["--names", a.names] if a.names else []
        cmd += ["--tolerances", a.tolerances] if a.tolerances else []
        cmd += ["--allow-looser-tolerances"] if getattr(a, "allow_looser_tolerances", False) else []
        return cmd + ["--case", case]

    def run_command(self, c) -> str | None:
        """The run command the judge put in front of its repro (the outputs' ``command``), without a
        ``--fixtures`` that names the default suite."""
        import shlex
        from pathlib import Path

        from gdncheck.conformance.judge.messages import repro as judge_repro

        a = self.args
        tail = f" --case {c.id} && " + judge_repro(str(Path(a.fixtures)), str(Path(a.outputs)), a.profile, c.id,
                                                    stage_isolated=a.stage_isolated, fused=a.fused, names=a.names)
        text = c.repro or ""
        if not text.endswith(tail) or len(text) == len(tail):
            return None
        command = text[:-len(tail)]
        try:
            words = shlex.split(command)
        except ValueError:
            return command
        at = next((i for i in range(len(words) - 1) if words[:2] == ["gdncheck", "run"]
                   and words[i] == "--fixtures" and self._is_default(words[i + 1])), None)
        if at is None:
            return command
        return shlex.join(words[:at] + words[at + 2:])

    def __call__(self, c) -> str:
        import shlex

        case = self.case(c.id)
        verify = shlex.join(self.verify_command(case))
        run = self.run_command(c)
        return f"{run} --case {shlex.quote(case)} && {verify}" if run else verify


def _suite_ids(fixtures: str) -> list[str] | None:
    """Every case id of the fixture suite's manifest (broken entries too), or None when unreadable."""
    from gdncheck.errors import GDNError
    from gdncheck.fixtures.manifest import load_manifest

    problems: list = []
    try:
        manifest = load_manifest(fixtures, problems)
    except (GDNError, OSError, ValueError):
        return None
    return [str(e["id"]) for e in manifest["cases"]] + [str(p.case) for p in problems]


def diagnoser(args: argparse.Namespace):
    """The likely-cause hook of verify: the transforms and every mutant (conformance/meta)."""
    if args.diagnose <= 0:
        return None
    from gdncheck.conformance.meta.catalogue import mutant_diagnoser

    return mutant_diagnoser(args.fixtures, limit=args.diagnose)
