"""The ``gdncheck`` command line.

Each subcommand lives in its own module under :mod:`gdncheck.commands` with two functions:
``configure(parser)`` adds its arguments and ``run(args) -> int`` returns the exit status.
Errors of gdncheck (bad input, bad files) print one line and exit 2; no raw traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ._version import __version__
from .errors import GDNError

#: name -> (module, one-line help). Order is the order of ``--help``.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("gdncheck.commands.demo", "run the float64 reference on built-in weights and print every stage"),
    "bench": ("gdncheck.commands.bench", "benchmark the float64 reference (python -m gdncheck.bench)"),
    "fixtures": ("gdncheck.commands.fixtures", "build, check or list the golden fixtures for ports"),
    "run": ("gdncheck.commands.run", "run an implementation over the fixtures, writing port-format outputs"),
    "verify": ("gdncheck.commands.verify", "judge a port's outputs against the goldens (exit 0/1/2)"),
    "report": ("gdncheck.commands.report", "write the HTML diff report of a verify summary (and CI summaries)"),
    "tolerances": ("gdncheck.commands.tolerances", "show or re-derive the earned tolerance table"),
    "gate": ("gdncheck.commands.gate", "the CI conformance gate: fixtures, run, verify, properties (exit 0/1/2)"),
    "gpu-bench": ("gdncheck.commands.gpu_bench", "benchmark the Triton kernels on a GPU (gpu_impl.bench)"),
}

DESCRIPTION = """\
gdncheck: the numerical verification and conformance suite for the Qwen3.5 Gated DeltaNet layer.
It holds a float64 reference of the whole layer and judges other implementations against it,
stage by stage."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except GDNError as exc:
        print(f"gdncheck {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gdncheck: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
