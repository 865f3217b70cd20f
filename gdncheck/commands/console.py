"""Where a command's lines go, the same for every command.

Human lines go to stdout, or to stderr when stdout carries the JSON summary (``--json``, or
``--summary -``), so ``gdncheck verify ... --json | jq .`` reads clean JSON; ``-q`` keeps the lines that
matter (problems, failures, the verdict) and drops progress. Errors are the CLI's own one line on
stderr (gdncheck/cli.py).
"""

from __future__ import annotations

import argparse
import json
import sys


def add_output_arguments(p: argparse.ArgumentParser, *, json_what: str | None = None) -> None:
    """``-q/--quiet``, and ``--json`` when the command has a summary to write."""
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines: problems, failures and the verdict")
    if json_what:
        p.add_argument("--json", action="store_true",
                       help=f"write {json_what} to stdout as JSON (human lines go to stderr)")


class Console:
    def __init__(self, args: argparse.Namespace):
        self.quiet = bool(getattr(args, "quiet", False))
        self.json = bool(getattr(args, "json", False))
        self.stream = sys.stderr if self.json else sys.stdout

    def say(self, text: str) -> None:
        """A line that is always printed (a problem, a failure, the verdict)."""
        print(text, file=self.stream, flush=True)

    def progress(self, text: str) -> None:
        """A line of progress (a case that passed, a file written): dropped by -q."""
        if not self.quiet:
            print(text, file=self.stream, flush=True)

    def emit_json(self, doc: dict) -> None:
        if self.json:
            sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")
            sys.stdout.flush()
