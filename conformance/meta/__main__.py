"""``python -m gdncheck.conformance.meta``: print the kill matrix (every mutant x profile)."""

from __future__ import annotations

import sys

from gdncheck.env import limit_blas_threads
from gdncheck.fixtures.manifest import DEFAULT_DIR
from gdncheck.profiles import VERIFY_PROFILES
from gdncheck.untrusted import OneLineParser

from .kill_matrix import CATALOGUE, format_matrix, kill


def main(argv=None) -> int:
    p = OneLineParser(prog="python -m gdncheck.conformance.meta", description=__doc__)
    p.add_argument("--profiles", default=",".join(VERIFY_PROFILES), help="comma-separated profiles (default all three)")
    p.add_argument("--fixtures", default=str(DEFAULT_DIR), help="fixture folder (default: the committed suite)")
    p.add_argument("--mutant", action="append", help="only this mutant (repeatable)")
    p.add_argument("--verbose", action="store_true", help="print the first failure message of each cell")
    args = p.parse_args(argv)
    limit_blas_threads()
    profiles = tuple(args.profiles.split(","))
    mutants = [m for m in CATALOGUE if not args.mutant or m.name in args.mutant]
    results = []
    for m in mutants:
        for prof in profiles:
            r = kill(m, prof, args.fixtures)
            results.append(r)
            if args.verbose:
                print(f"{m.name} [{prof}]: {r.cell()}\n  {r.message}\n  repro: {r.repro}\n", file=sys.stderr)
    print(format_matrix(results, profiles))
    survivors = [r for r in results if not r.killed and r.cases]  # "no case": not run, not a survivor
    return 1 if survivors and len(survivors) == len(results) else 0


if __name__ == "__main__":
    sys.exit(main())
