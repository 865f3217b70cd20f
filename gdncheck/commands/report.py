"""``gdncheck report``: the HTML diff report of a verify summary, and short summaries for CI."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Write the HTML diff report of a verify summary (gdncheck verify --summary) into a folder: an
index with the verdict, the environment and a grid of cases × stages, and a page per case that
reads top-down: the first divergence and its likely cause, its error heatmap, histogram,
error-over-tokens curve, worst elements and minimum passing tolerance (and those of the two worst
other failing tensors), then the metrics of every call and stage tensor in folded tables. The
folder opens from file:// (no network); a port failing every case gets a report of about 2 MB in a
few seconds. Plots reload the full tensors from the fixture and outputs files the summary names
(--fixtures / --outputs if they moved).

Always prints a short text summary (for CI logs); --markdown appends a Markdown summary to a file
(e.g. "$GITHUB_STEP_SUMMARY") or prints it with "-". Exit status 0 when written, 2 for an unusable
summary or folder: a summary over 64 MB, naming a case twice, or whose verdict, exit code or totals
its cases contradict is refused (a repro line not in verify's form is withheld), and neither -o nor
--markdown may lie in a fixture suite (docs/report.md)."""


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("summary", metavar="SUMMARY.json", help="the JSON summary verify wrote")
    p.add_argument("-o", "--out", metavar="DIR", help="folder for the HTML report (replaced as a whole)")
    p.add_argument("--fixtures", help="fixture folder, if the files moved since verify ran")
    p.add_argument("--outputs", help="the port's outputs folder, if it moved since verify ran")
    p.add_argument("--markdown", metavar="PATH", help="append a Markdown summary to PATH ('-': print it)")
    p.add_argument("--top-k", type=int, default=10,
                   help="worst elements listed for the first divergence (default 10; at most 5 for the others)")
    p.add_argument("-q", "--quiet", action="store_true", help="no text summary")


def run(args: argparse.Namespace) -> int:
    from gdncheck.reports import markdown_summary, text_summary, write_report
    from gdncheck.reports.model import load_summary
    from gdncheck.writes import refuse_write, refuse_write_into_suite

    # every output path refused before the summary is read: never into a fixture suite
    if args.out:
        refuse_write_into_suite(args.out, "--out", fixtures=args.fixtures)
    if args.markdown and args.markdown != "-":
        refuse_write(args.markdown, "--markdown", append=True)
    doc = load_summary(args.summary)
    index = None
    if args.out:
        from gdncheck.reports.site import check_report_folder
        from gdncheck.untrusted import folder_lock

        check_report_folder(args.out)  # refused before anything, the lock too, is written beside it
        with folder_lock(args.out, "--out", beside=True):  # one writer per folder (it is replaced whole)
            index = write_report(doc, args.out, fixtures_dir=args.fixtures, outputs_dir=args.outputs,
                                 top_k=args.top_k)
    if args.markdown:
        emit_markdown(markdown_summary(doc, report=str(index) if index else None), args.markdown)
    if not args.quiet:
        print(text_summary(doc, report=index), end="")
    return 0


def emit_markdown(text: str, dest: str) -> None:
    """Append to ``dest`` (a CI job summary file is appended to), or print for ``-``."""
    if dest == "-":
        print(text, end="")
        return
    import os
    import stat

    from gdncheck.errors import GDNError

    try:  # never through a link: appending through one writes to whatever it points at
        fd = os.open(dest, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError as exc:
        if os.path.islink(dest):
            raise GDNError(f"--markdown {dest} is a symbolic link, expected a file to append to (a CI job "
                           f"summary file): it is not followed") from None
        raise GDNError(f"--markdown {dest}: cannot append to it ({exc.strerror or exc})") from None
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise GDNError(f"--markdown {dest} is not a regular file, expected a file to append to")
        f.write(text)
