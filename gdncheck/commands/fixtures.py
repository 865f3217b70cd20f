"""``gdncheck fixtures``: build, check and list golden fixtures (fixtures/FORMAT.md)."""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = """\
Golden fixtures for ports of the GDN layer (fixtures/FORMAT.md).

  build   run the float64 reference over every case of a suite and write one safetensors file per
          case plus manifest.json (in the reference's golden arithmetic: a rebuild is bit-identical on
          every CPU, x86-64 with or without AVX-512 and arm64);
          --from-checkpoint DIR --layer N builds cases from a real checkpoint's weights instead
  check   rebuild in memory and compare every checksum with the manifest and the files (drift
          detection; exit 1 when something changed)
  list    print the cases of a fixture folder"""


def configure(p: argparse.ArgumentParser) -> None:
    from gdncheck.fixtures.manifest import DEFAULT_DIR

    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    b = sub.add_parser("build", help="build a suite (or cases from a checkpoint)")
    b.add_argument("--suite", choices=("default", "full", "serving"), default="default",
                   help="default: the committed suite; full: adds real Qwen3.5 sizes (large, slow); serving: "
                        "the serving patterns' cases (packed calls, slots, spec decode, prefix cache)")
    b.add_argument("--out", default=None, help=f"output folder (default: {DEFAULT_DIR} for default, "
                                               "./fixtures-<suite> otherwise)")
    b.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    b.add_argument("--case", action="append", help="only this case (id or recipe name; repeatable)")
    b.add_argument("--from-checkpoint", metavar="DIR", help="a Hugging Face checkpoint folder to take weights from")
    b.add_argument("--layer", type=int, help="the GDN layer index of --from-checkpoint")
    c = sub.add_parser("check", help="rebuild in memory and compare checksums")
    c.add_argument("--fixtures", default=str(DEFAULT_DIR), help=f"fixture folder (default {DEFAULT_DIR})")
    c.add_argument("--jobs", type=int, default=1)
    c.add_argument("--quiet", action="store_true", help="print only problems and the summary line")
    ls = sub.add_parser("list", help="list the cases of a fixture folder")
    ls.add_argument("--fixtures", default=str(DEFAULT_DIR))


def run(args: argparse.Namespace) -> int:
    from gdncheck.env import limit_blas_threads

    limit_blas_threads()
    return {"build": _build, "check": _check, "list": _list}[args.action](args)


def _build(args) -> int:
    from gdncheck.errors import GDNError
    from gdncheck.fixtures.build import build_checkpoint_suite, build_suite
    from gdncheck.fixtures.manifest import DEFAULT_DIR

    if args.from_checkpoint:
        if args.layer is None:
            raise GDNError("--from-checkpoint needs --layer N (the GDN layer to take)")
        out = args.out or f"fixtures-checkpoint-l{args.layer}"
        doc = build_checkpoint_suite(args.from_checkpoint, args.layer, out, progress=print)
    else:
        out = args.out or (str(DEFAULT_DIR) if args.suite == "default" else f"fixtures-{args.suite}")
        doc = build_suite(args.suite, out, jobs=args.jobs, names=args.case, progress=print)
    size = sum(c["bytes"] for c in doc["cases"])
    print(f"wrote {len(doc['cases'])} cases ({size / 1e6:.1f} MB) and manifest.json to {out}")
    return 0


def _check(args) -> int:
    from gdncheck.fixtures.build import check_suite

    report = check_suite(args.fixtures, jobs=args.jobs)
    bad = [r for r in report if r["status"] in ("changed", "missing")]
    for r in report:
        if not args.quiet or r in bad:
            print(f"{r['status']:<17} {r['id']}: {r['detail']}")
    near = sum(r["status"] == "numerically-equal" for r in report)
    print(f"{len(report) - len(bad)}/{len(report)} cases reproduce"
          + (f" ({near} numerically equal but not bit-identical: this platform broke the fixture guarantee, "
             "FORMAT.md §11)" if near else "")
          + ("" if not bad else f"; {len(bad)} changed: rebuild with gdncheck fixtures build and review the diff"),
          file=sys.stdout)
    return 1 if bad else 0


def _list(args) -> int:
    from gdncheck.fixtures.manifest import load_manifest

    m = load_manifest(args.fixtures)
    print(f"suite {m['suite']}, format {m['format_version']}, {len(m['cases'])} cases")
    for c in m["cases"]:
        extra = f" expects {c['expected_error']['code']}" if c["expected_error"] else ""
        print(f"{c['id']:<52} {c['bytes'] / 1e6:6.2f} MB  {','.join(c['tags'])}{extra}")
    return 0
