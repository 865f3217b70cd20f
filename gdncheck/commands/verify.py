"""``gdncheck verify``: judge a port's outputs against the golden fixtures."""

from __future__ import annotations

import argparse

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
stops early leaves no stale verdict behind."""


def configure(p: argparse.ArgumentParser) -> None:
    from gdncheck.fixtures.manifest import DEFAULT_DIR

    p.add_argument("--fixtures", default=str(DEFAULT_DIR), help=f"fixture folder (default {DEFAULT_DIR})")
    p.add_argument("--outputs", required=True, help="the port's outputs folder")
    p.add_argument("--profile", required=True, choices=VERIFY_PROFILES, help="precision profile")
    p.add_argument("--stage-isolated", action="store_true", help="outputs of stages run alone from golden inputs")
    p.add_argument("--case", action="append", help="only this case (id or id prefix; repeatable)")
    p.add_argument("--tag", action="append", help="only cases with this tag (repeatable)")
    p.add_argument("--shard", help="I/N: every N-th selected case from the I-th (0-based)")
    p.add_argument("--tolerances", help="tolerance table (default: the packaged conformance/judge/tolerances.json)")
    p.add_argument("--summary", help="where to write the JSON summary (default OUTPUTS/verify-summary-PROFILE.json; "
                                     "'-': to stdout, as --json)")
    p.add_argument("--junit", help="also write JUnit XML here (one testcase per case and stage; for CI publishers)")
    p.add_argument("--verbose", action="store_true", help="print every failing record, not only the first per case")
    p.add_argument("--names", metavar="TABLE",
                   help="read the port's own tensor names through a name table: hf, doppler, metrale or a JSON path "
                        "(docs/names.md)")
    p.add_argument("--report", metavar="DIR", help="also write the HTML diff report there (docs/report.md)")
    p.add_argument("--diagnose", type=int, default=8, metavar="N",
                   help="name the likely cause of the first N failing cases (default 8; 0: none): each runs every "
                        "known bug class on the case (docs/meta.md)")
    p.add_argument("--fixtures-sha256", metavar="SHA256",
                   help="refuse a fixture folder whose manifest.json has another sha256 (pin a vendored suite)")
    add_output_arguments(p, json_what="the summary (also written to --summary's file unless that is '-')")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gdncheck.commands.run import output_file, parse_shard
    from gdncheck.conformance.judge.verify import verify
    from gdncheck.errors import GDNError
    from gdncheck.fixtures.manifest import refuse_output_in_suite
    from gdncheck.testing import case_text
    from gdncheck.untrusted import safe_text

    to_file = args.summary != "-"  # '-': the summary goes to stdout only
    if not to_file:
        args.json = True
    con = Console(args)

    def say(text: str) -> None:
        con.say(safe_text(text, keep_newlines=True))

    def progress(c):
        text = safe_text(case_text(c), keep_newlines=True)  # each piece one line, port strings made visible
        (con.progress if c.status in ("pass", "not_applicable") else con.say)(text)
        if c.status == "fail" and c.diagnosis:
            say(f"      likely cause: {safe_text(c.diagnosis['text'])}")
        if args.verbose and c.status == "fail":
            for r in c.records:
                if r.verdict == "fail" and r.message != c.message:
                    say(f"      also: {safe_text(r.message)}")
        for note in c.notes:
            con.progress(safe_text(f"      note: {safe_text(note)}", keep_newlines=True))

    # every path checked, and the stale results removed, before anything is judged
    outputs = Path(args.outputs)
    if not outputs.is_dir():  # a typo would judge every case "no outputs file", and make the folder for the summary
        raise GDNError(f"--outputs {outputs}: expected the port's outputs folder, found "
                         + ("nothing" if not outputs.exists() else "a file"))
    path = output_file(Path(args.summary) if args.summary and to_file else
                       Path(args.outputs) / f"verify-summary-{args.profile}.json", "--summary")
    junit_path = output_file(args.junit, "--junit") if args.junit else None
    for target, flag in ((path, "--summary"), (junit_path, "--junit"), (args.report, "--report")):
        if target is not None:
            refuse_output_in_suite(Path(target).parent if flag != "--report" else target, None, flag)
    if args.report:  # refused now, not after the whole run
        from gdncheck.reports.site import check_report_folder

        check_report_folder(args.report)
    for stale in (path if to_file else None, junit_path):
        if stale is not None and stale.is_file():
            stale.unlink()
    summary = verify(args.fixtures, args.outputs, args.profile, cases=args.case, tags=args.tag,
                     shard=parse_shard(args.shard), stage_isolated=args.stage_isolated, tolerances=args.tolerances,
                     progress=progress, names=args.names, diagnose=diagnoser(args),
                     manifest_sha256=args.fixtures_sha256)
    if to_file:
        summary.write(path)
    if junit_path:
        from gdncheck.reports.junit import JUnit, add_verify_summary

        junit = JUnit("gdncheck verify")
        add_verify_summary(junit, summary)
        junit.write(junit_path)
    t = summary.totals()
    for note in summary.notes:
        say(f"note: {safe_text(note)}")
    say(summary.coverage_line())
    say(f"{summary.verdict()}: {t['passed']}/{t['cases']} cases pass, {t['failed']} fail, {t['errors']} unusable, "
        f"{t['not_applicable']} not applicable; "
        f"{t['records'] - t['records_missing']} tensors judged, {t['records_failed']} failed, "
        f"{t['records_missing']} not provided "
        f"[{safe_text(summary.implementation.get('name'))}, profile {args.profile}, {summary.mode}]; summary: "
        f"{path if to_file else 'stdout'}")
    if args.report:
        from gdncheck.reports import write_report

        index = write_report(summary.to_json(), args.report, fixtures_dir=args.fixtures, outputs_dir=args.outputs)
        con.progress(safe_text(f"report: {index}"))
    con.emit_json(summary.to_json())
    return summary.exit_code


def diagnoser(args: argparse.Namespace):
    """The likely-cause hook of verify: the transforms and every mutant (conformance/meta)."""
    if args.diagnose <= 0:
        return None
    from gdncheck.conformance.meta.catalogue import mutant_diagnoser

    return mutant_diagnoser(args.fixtures, limit=args.diagnose)
