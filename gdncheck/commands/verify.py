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
outside its folder); every other case is still verified."""


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
    add_output_arguments(p, json_what="the summary (also written to --summary's file unless that is '-')")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gdncheck.commands.run import existing_folder, parse_shard
    from gdncheck.conformance.judge.verify import verify
    from gdncheck.testing import case_text

    to_file = args.summary != "-"  # '-': the summary goes to stdout only
    if not to_file:
        args.json = True
    con = Console(args)
    existing_folder(args.outputs, "--outputs", "the port's outputs folder")  # a typo: one error, nothing created

    def progress(c):
        (con.progress if c.status in ("pass", "not_applicable") else con.say)(case_text(c))
        if args.verbose and c.status == "fail":
            for r in c.records:
                if r.verdict == "fail" and r.message != c.message:
                    con.say(f"      also: {r.message}")
        for note in c.notes:
            con.progress(f"      note: {note}")

    summary = verify(args.fixtures, args.outputs, args.profile, cases=args.case, tags=args.tag,
                     shard=parse_shard(args.shard), stage_isolated=args.stage_isolated, tolerances=args.tolerances,
                     progress=progress, names=args.names)
    path = Path(args.summary) if args.summary else Path(args.outputs) / f"verify-summary-{args.profile}.json"
    if to_file:
        summary.write(path)
    if args.junit:
        from gdncheck.reports.junit import JUnit, add_verify_summary

        junit = JUnit("gdncheck verify")
        add_verify_summary(junit, summary)
        junit.write(args.junit)
    t = summary.totals()
    for note in summary.notes:
        con.say(f"note: {note}")
    con.say(f"{summary.verdict()}: {t['passed']}/{t['cases']} cases pass, {t['failed']} fail, {t['errors']} unusable, "
          f"{t['not_applicable']} not applicable; "
          f"{t['records']} tensors judged, {t['records_failed']} failed, {t['records_missing']} not provided "
          f"[{summary.implementation.get('name')}, profile {args.profile}, {summary.mode}]; summary: "
            f"{path if to_file else 'stdout'}")
    if args.report:
        from gdncheck.reports import write_report

        index = write_report(summary.to_json(), args.report, fixtures_dir=args.fixtures, outputs_dir=args.outputs)
        con.progress(f"report: {index}")
    con.emit_json(summary.to_json())
    return summary.exit_code
