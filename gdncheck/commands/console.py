"""Where a command's lines go, the same for every command.

Human lines go to stdout, or to stderr when stdout carries the JSON summary (``--json``, or
``--summary -``), so ``gdncheck verify ... --json | jq .`` reads clean JSON; ``-q`` keeps the lines that
matter (problems, failures, the verdict) and drops progress. Errors are the CLI's own one line on
stderr (gdncheck/cli.py).

Colour and the transient status line exist only on a terminal: a status word (``FAIL``, ``pass``,
a verdict) is coloured when the stream is a tty, ``NO_COLOR`` is unset or empty and ``TERM`` is not
``dumb`` (https://no-color.org); a log, a pipe or a file never holds an escape sequence gdncheck
wrote. Colour is added after :func:`gdncheck.untrusted.safe_text`, so a port's words stay escaped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

#: SGR codes of the styles :meth:`Console.paint` knows
STYLES = {"fail": "1;31", "pass": "32", "warn": "33", "dim": "2"}
#: the status word that starts a line, and its style
_WORDS = (("FAIL", "fail"), ("ERROR", "fail"), ("does not conform", "fail"), ("inputs unusable", "fail"),
          ("nothing judged", "warn"), ("n/a", "warn"), ("pass", "pass"), ("conforms", "pass"))


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a replaced stream (pytest's capture), a closed one
        return False


def use_colour(stream, environ=os.environ) -> bool:
    """Colour on ``stream``: a terminal, ``NO_COLOR`` unset or empty, ``TERM`` not ``dumb``."""
    return _isatty(stream) and not environ.get("NO_COLOR") and environ.get("TERM") != "dumb"


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
        self.tty = _isatty(self.stream)
        self.colour = use_colour(self.stream)
        self._status = False  # a transient status line is on the terminal

    def say(self, text: str) -> None:
        """A line that is always printed (a problem, a failure, the verdict)."""
        self.clear_status()
        print(text, file=self.stream, flush=True)

    def progress(self, text: str) -> None:
        """A line of progress (a case that passed, a file written): dropped by -q."""
        if not self.quiet:
            self.clear_status()
            print(text, file=self.stream, flush=True)

    def status(self, text: str) -> None:
        """A transient line on a terminal (``judged 12 case(s), 11 failing``), overwritten by the next
        one and erased before any other line; nothing anywhere else, nor with -q."""
        if self.quiet or not self.tty:
            return
        width = max(20, shutil.get_terminal_size((100, 24)).columns - 1)
        self.stream.write("\r\x1b[K" + text[:width])
        self.stream.flush()
        self._status = True

    def clear_status(self) -> None:
        if self._status:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._status = False

    def paint(self, text: str, style: str) -> str:
        """``text`` in a style of :data:`STYLES` where colour is on; unchanged elsewhere."""
        return f"\x1b[{STYLES[style]}m{text}\x1b[0m" if self.colour and text else text

    def mark(self, line: str) -> str:
        """A line whose first word is a status (``FAIL  ...``, ``does not conform: ...``), that word
        painted. Call it on text already made safe: only gdncheck's own escape is added."""
        for word, style in _WORDS:
            if line.startswith(word):
                return self.paint(word, style) + line[len(word):]
        return line

    def emit_json(self, doc: dict) -> None:
        if self.json:
            sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")
            sys.stdout.flush()
