"""The ``gdncheck`` command line.

Each subcommand lives in its own module under :mod:`gdncheck.commands` with two functions:
``configure(parser)`` adds its arguments and ``run(args) -> int`` returns the exit status.
Errors of gdncheck (bad input, bad files) print one line and exit 2; no raw traceback, and an
unexpected exception is one line and exit 2 too (``GDN_DEBUG=1`` shows its traceback).
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import sys
from pathlib import PurePath

from ._version import __version__
from .errors import GDNError
from .untrusted import OneLineParser, one_line

#: name -> (module, one-line help). Order is the order of ``--help``.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("gdncheck.commands.demo", "run the float64 reference on built-in weights and print every stage"),
    "bench": ("gdncheck.commands.bench", "benchmark the float64 reference (python -m gdncheck.bench)"),
    "fixtures": ("gdncheck.commands.fixtures", "build, check or list the golden fixtures for ports"),
    "run": ("gdncheck.commands.run", "run an implementation over the fixtures, writing port-format outputs"),
    "verify": ("gdncheck.commands.verify", "judge a port's outputs against the goldens (exit 0/1/2)"),
    "engines": ("gdncheck.commands.engines", "run and verify every installed engine: the cross-engine matrix"),
    "report": ("gdncheck.commands.report", "write the HTML diff report of a verify summary (and CI summaries)"),
    "tolerances": ("gdncheck.commands.tolerances", "show or re-derive the earned tolerance table"),
    "gate": ("gdncheck.commands.gate", "the CI conformance gate: fixtures, run, verify, properties (exit 0/1/2)"),
    "template": ("gdncheck.commands.template", "write a runner template for a port in another language (node)"),
    "gpu-bench": ("gdncheck.commands.gpu_bench", "benchmark the Triton kernels on a GPU (gpu_tools.bench)"),
}

DESCRIPTION = """\
gdncheck: the numerical verification and conformance suite for the Qwen3.5 Gated DeltaNet layer.
It holds a float64 reference of the whole layer and judges other implementations against it,
stage by stage."""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="gdncheck", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"gdncheck {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=help_text, description=getattr(mod, "DESCRIPTION", help_text),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.configure(p)
        p.set_defaults(_run=mod.run)
    return parser


#: Local names that, in the frames an OSError passed through, hold the path it concerns.
_PATH_LOCALS = ("path", "filename", "file", "target", "dest")


def _path_in_traceback(exc: BaseException) -> str | None:
    """The file an OSError without a file name concerns (a ``write`` that ran out of space names none),
    found in the frames it came through, innermost first: an open file object's name, the path a
    ``pathlib`` method was called on, or a local holding a path."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        values = frame.f_locals
        for value in values.values():
            if isinstance(value, io.IOBase) and isinstance(getattr(value, "name", None), str):
                return value.name
        if isinstance(values.get("self"), PurePath):
            return str(values["self"])
        for key in _PATH_LOCALS:
            if isinstance(values.get(key), PurePath):
                return str(values[key])
    return None


def os_error_line(exc: OSError) -> str:
    """One line for a file that could not be read or written: the path(s) it concerns (from the error,
    else from where it was raised) and why."""
    names = [str(n) for n in (exc.filename, exc.filename2) if n not in (None, "")]
    if not names:
        found = _path_in_traceback(exc)
        names = [found] if found else []
    what = " -> ".join(names) if names else "a file (its name unknown)"
    why = exc.strerror or str(exc) or type(exc).__name__
    return f"cannot use {one_line(what)}: {one_line(why)}"


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status. Every failure to run is exit 2 and one line on stderr: a
    gdncheck error (bad input: what was expected, what was found, where), a file that cannot be
    read or written, and, as a last resort, an unexpected exception, reported as the gdncheck bug it
    is (``GDN_DEBUG=1`` raises it with its traceback instead). Exit 1 only ever means "does not
    conform"."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        print(f"gdncheck: error: expected a command ({', '.join(COMMANDS)}), found none "
              "(usage: gdncheck --help)", file=sys.stderr)
        return 2
    where = f"gdncheck {args.command}"
    try:
        return int(args._run(args) or 0)
    except GDNError as exc:
        print(f"{where}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{where}: error: {os_error_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gdncheck: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the last resort: one line and exit 2, never a traceback and exit 1
        if os.environ.get("GDN_DEBUG"):
            raise
        print(f"{where}: internal error: {type(exc).__name__}: {one_line(exc)} (a gdncheck bug: please report it; "
              f"rerun with GDN_DEBUG=1 for the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
