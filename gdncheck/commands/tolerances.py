"""``gdncheck tolerances``: show or re-derive the earned tolerance table (docs/tolerances.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gdncheck.harness.outputs import END_TO_END, MODES, STAGE_ISOLATED
from gdncheck.profiles import VERIFY_PROFILES

DESCRIPTION = """\
The tolerance table verify applies: bounds per (mode, profile, case recipe, tensor), earned from
the envelope of correct low-precision implementations (docs/tolerances.md).

  show     print the global bounds per profile (one case recipe's with --case, the property suite's
           with --properties)
  derive   re-derive the table from data and write it; by default from --suite full, the committed
           suite's recipes plus real Qwen3.5 sizes (21 minutes and 7.7 GB with --jobs 2 when last
           measured, for table v2); --suite default, the committed suite's recipes alone, takes 4 to 8
           minutes with --jobs 2 but drops the real-size rows (docs/tolerances.md)"""


def configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = sub.add_parser("show", help="print bounds")
    s.add_argument("--mode", choices=MODES, default=END_TO_END,
                   help=f"the bounds of whole programs ({END_TO_END}, the default) or of each stage run alone "
                        f"from golden inputs ({STAGE_ISOLATED}: verify --stage-isolated)")
    s.add_argument("--case", help="a case id or recipe (default: the global bounds)")
    s.add_argument("--properties", action="store_true",
                   help="the bounds of layers the property suite generates (end to end; not with --case)")
    s.add_argument("--table", help="table file (default: the packaged one)")
    d = sub.add_parser("derive", help="re-derive the table (default --suite full)")
    d.add_argument("--out", help="where to write it (default: conformance/judge/tolerances.json of a source "
                        "checkout; an installed gdncheck needs --out)")
    d.add_argument("--jobs", type=int, default=1, help="worker processes running the observations (default 1)")
    d.add_argument("-q", "--quiet", action="store_true", help="no line per observation: the file written only")
    d.add_argument("--seeds", default="1,2,3,4", help="comma-separated seeds (default 1,2,3,4; never 0)")
    d.add_argument("--suite", choices=("default", "full"), default="full",
                   help="recipes to derive from (default full: the default suite plus real Qwen3.5 sizes; "
                        "default alone takes 4 to 8 minutes with --jobs 2)")


def run(args: argparse.Namespace) -> int:
    from gdncheck.conformance.earn import derive
    from gdncheck.conformance.judge import tolerances
    from gdncheck.conformance.properties import draws
    from gdncheck.installed import refuse_write_into_package
    from gdncheck.safetensors_io import write_bytes_atomic

    if args.action == "derive":
        refuse_write_into_package(args.out or tolerances.TABLE_PATH, "--out")  # before the minute of work
        seeds = tuple(int(s) for s in args.seeds.split(","))
        doc = derive.derive(seeds=seeds, jobs=args.jobs, suite_name=args.suite,
                            extra_jobs=draws.jobs(seeds), extra_note=draws.note(seeds),
                            progress=None if args.quiet else lambda m: print(f"observed {m}", flush=True))
        path = args.out or tolerances.TABLE_PATH
        data = derive.encode_table(doc)
        write_bytes_atomic(path, data)
        print(f"wrote {path}")
        import hashlib

        sha = hashlib.sha256(data).hexdigest()
        if sha != tolerances.SHIPPED_SHA256 and Path(path).resolve() == tolerances.TABLE_PATH.resolve():
            print(f"the packaged table changed: set SHIPPED_SHA256 = \"{sha}\" in conformance/judge/tolerances.py "
                  "(the pin a release ships; until then nothing is judged with it)")
        return 0
    table = tolerances.load_table(args.table)
    if args.properties and (args.case or args.mode != END_TO_END):
        raise tolerances.ToleranceError(f"expected --properties alone (end-to-end bounds of generated layers), "
                                        f"found it with {'--case' if args.case else '--mode ' + args.mode}")
    recipe = tolerances.recipe_of(args.case) if args.case else None
    print(f"tolerance table v{table.version} ({table.source}, sha256 {table.sha256[:16]}), mode {args.mode}, "
          f"{'case ' + recipe if recipe else 'properties' if args.properties else 'global'}; "
          f"elem = scaled elementwise error, nmse = per-call NMSE")
    profiles = VERIFY_PROFILES
    rows = table.data["modes"][args.mode]
    names = list(rows[profiles[0]]["global"])
    print(f"{'tensor':<16}" + "".join(f"{p + ' elem':>12}{p + ' nmse':>12}" for p in profiles))
    for name in names:
        cells = []
        for p in profiles:
            b = table.property_bound(name, p) if args.properties else table.bound(name, p, args.mode, args.case)
            cells.append(f"{b.elem:>12.3g}{b.nmse:>12.3g}")
        print(f"{name:<16}" + "".join(cells))
    return 0
