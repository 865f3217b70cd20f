"""``python -m gdncheck.conformance.meta``: print the kill matrix (every mutant x profile) with margins
and the coverage depth (how many cases catch each mutant, and which), or write them into the docs
(``--write-docs docs/meta.md`` replaces the generated blocks there; with ``--depth-only``, the depth
block alone, measured without the diagnosis: minutes, not half an hour)."""

from __future__ import annotations

import sys

from gdncheck.env import limit_blas_threads
from gdncheck.fixtures.manifest import DEFAULT_DIR
from gdncheck.profiles import VERIFY_PROFILES
from gdncheck.untrusted import OneLineParser

from .kill_matrix import (
    CATALOGUE,
    DEPTH_BEGIN,
    DEPTH_END,
    PORT_PLACEMENTS,
    format_depth,
    format_matrix,
    has_block,
    matrix,
    write_block,
    write_docs,
)


def main(argv=None) -> int:
    p = OneLineParser(prog="python -m gdncheck.conformance.meta", description=__doc__)
    p.add_argument("--profiles", default=",".join(VERIFY_PROFILES), help="comma-separated profiles (default all three)")
    p.add_argument("--fixtures", default=str(DEFAULT_DIR), help="fixture folder (default: the committed suite)")
    p.add_argument("--mutant", action="append", help="only this mutant (repeatable)")
    p.add_argument("--case", action="append", help="only this case (id or id prefix; repeatable)")
    p.add_argument("--tolerances", help="tolerance table (default: the packaged one)")
    p.add_argument("--write-docs", metavar="FILE", help="write the table into FILE's generated kill-matrix block")
    p.add_argument("--depth-only", action="store_true",
                   help="only the coverage depth (per mutant and profile, the cases that catch it), without the "
                        "diagnosis; with --write-docs, only the depth block is rewritten")
    p.add_argument("--no-diagnosis", action="store_true",
                   help="skip the likely-cause table (each mutant run again as a port and diagnosed)")
    p.add_argument("--jobs", type=int, default=1, help="processes running the mutants of a profile side by side")
    p.add_argument("--diagnose-case", action="append",
                   help="diagnose only on this case (id or id prefix; repeatable; default: the cases run)")
    p.add_argument("--port-placement", action="append", choices=PORT_PLACEMENTS,
                   help="a placement the mutants run in as diagnosed ports (repeatable; default all of "
                        f"{', '.join(PORT_PLACEMENTS)}; the first gives the per-mutant table)")
    p.add_argument("--verbose", action="store_true", help="print the first failure message of each cell")
    p.add_argument("--leave-one-out", action="store_true",
                   help="instead: diagnose each mutant (the catalogue's and the held-out ones) with its own bug "
                        "class removed, and count the symptoms that state a true specific fact, nothing, or a "
                        "wrong one (docs/meta.md, 'Symptoms, held out')")
    args = p.parse_args(argv)
    limit_blas_threads()
    profiles = tuple(args.profiles.split(","))
    if args.leave_one_out:
        from .heldout_mutants import HELDOUT_MUTANTS
        from .kill_matrix import format_loo, leave_one_out

        chosen = [m for m in (*CATALOGUE, *HELDOUT_MUTANTS) if not args.mutant or m.name in args.mutant]
        res = leave_one_out(profiles, args.fixtures, chosen, cases=args.case,
                            progress=lambda r: print(f"{r.mutant} [{r.profile}]: {r.after}", file=sys.stderr))
        print(format_loo(res, profiles))
        return 0
    mutants = [m for m in CATALOGUE if not args.mutant or m.name in args.mutant]
    def progress(r):
        print(f"{r.mutant} [{r.profile}]: {r.cell()}; likely cause {r.diagnosis_cell()}"
              + (f"\n  {r.message}\n  repro: {r.repro}\n" if args.verbose else ""), file=sys.stderr, flush=True)

    if args.write_docs and args.depth_only and not has_block(args.write_docs, DEPTH_BEGIN, DEPTH_END):
        p.error(f"--write-docs {args.write_docs}: expected a generated depth block ({DEPTH_BEGIN} ... "
                f"{DEPTH_END}), found none")
    results = matrix(profiles, args.fixtures, mutants, tolerances=args.tolerances, cases=args.case,
                     diagnose=not (args.no_diagnosis or args.depth_only), progress=progress, jobs=args.jobs,
                     diagnose_cases=args.diagnose_case, placements=tuple(args.port_placement or PORT_PLACEMENTS))
    depth = format_depth(results, profiles, mutants, args.fixtures)
    table = None if args.depth_only else format_matrix(results, profiles, mutants)
    print(depth if table is None else f"{table}\n\n{depth}")
    if args.write_docs:
        if table is not None:
            write_docs(args.write_docs, table)
            print(f"wrote the kill matrix into {args.write_docs}", file=sys.stderr)
        if has_block(args.write_docs, DEPTH_BEGIN, DEPTH_END):
            write_block(args.write_docs, depth, DEPTH_BEGIN, DEPTH_END, "depth")
            print(f"wrote the coverage depth into {args.write_docs}", file=sys.stderr)
        else:
            print(f"{args.write_docs} has no depth block ({DEPTH_BEGIN}): the depth is printed only", file=sys.stderr)
    survivors = [r for r in results if not r.killed and r.cases]  # "no case": not run, not a survivor
    return 1 if survivors and len(survivors) == len(results) else 0


if __name__ == "__main__":
    sys.exit(main())
