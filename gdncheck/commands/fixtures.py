"""``gdncheck fixtures``: build, check and list golden fixtures (fixtures/FORMAT.md)."""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = """\
Golden fixtures for ports of the GDN layer (fixtures/FORMAT.md).

  build   run the float64 reference over every case of a suite and write one safetensors file per
          case plus manifest.json (in the reference's golden arithmetic: a rebuild is bit-identical on
          every CPU, x86-64 with or without AVX-512 and arm64) into --out (default ./fixtures-<suite>);
          over an existing suite, only the cases built are replaced (--prune removes the others), and a
          folder holding anything but a suite is refused;
          --from-checkpoint DIR --layer N builds cases from a real checkpoint's weights instead
  check   rebuild in memory and compare every checksum with the manifest and the files (drift
          detection; exit 1 when something changed; exit 2 when a manifest entry is unusable: each
          such entry one line, every other case still checked, as verify judges them)
  list    print the cases of a fixture folder
  path    print the folder of the committed default suite that verify and gate use by default (it
          ships inside the package), after checking every file against its sha256
  export  copy the committed default suite into a new or empty folder (to vendor it, or to run a port
          from a copy), checksums verified

gdncheck never writes into an installed package (site-packages): build and export refuse a folder
there; rebuilding the committed suite is done in a source checkout."""


def configure(p: argparse.ArgumentParser) -> None:
    from gdncheck.fixtures.manifest import DEFAULT_DIR

    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    b = sub.add_parser("build", help="build a suite (or cases from a checkpoint)")
    b.add_argument("--suite", choices=("default", "full", "serving", "sharded"), default="default",
                   help="default: the committed suite; full: adds real Qwen3.5 sizes (large, slow); serving: "
                        "the serving patterns' cases (packed calls, slots, spec decode, prefix cache); sharded: the "
                        "tensor- and context-parallel cases (docs/sharding.md)")
    b.add_argument("--out", default=None, help="output folder (default ./fixtures-<suite>, or "
                                               "./fixtures-checkpoint-l<N>); to rebuild the committed suite of a "
                                               "source checkout, --out fixtures/default")
    b.add_argument("--prune", action="store_true",
                   help="make the suite in --out hold exactly the cases built: remove the files of the others (by "
                        "default an existing suite keeps every case not rebuilt), or replace a suite of another name")
    b.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    b.add_argument("--case", action="append", help="only this case (id or recipe name; repeatable)")
    b.add_argument("--from-checkpoint", metavar="DIR", help="a Hugging Face checkpoint folder to take weights from")
    b.add_argument("--layer", type=int, help="the GDN layer index of --from-checkpoint")
    b.add_argument("-q", "--quiet", action="store_true", help="no line per case: the summary line only")
    c = sub.add_parser("check", help="rebuild in memory and compare checksums")
    c.add_argument("--fixtures", default=str(DEFAULT_DIR), help=f"fixture folder (default {DEFAULT_DIR})")
    c.add_argument("--jobs", type=int, default=1, help="worker processes rebuilding the cases (default 1)")
    c.add_argument("-q", "--quiet", action="store_true", help="print only problems and the summary line")
    c.add_argument("--checkpoint", metavar="DIR", help="the checkpoint a suite built --from-checkpoint is rebuilt "
                                                       "from (the folder its manifest names is never read)")
    ls = sub.add_parser("list", help="list the cases of a fixture folder")
    ls.add_argument("--fixtures", default=str(DEFAULT_DIR), help=f"fixture folder (default {DEFAULT_DIR})")
    sub.add_parser("path", help="print the committed default suite's folder (checksums verified)")
    ex = sub.add_parser("export", help="copy the committed default suite into DIR (checksums verified)")
    ex.add_argument("dest", metavar="DIR", help="a new or empty folder")
    ex.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")


def run(args: argparse.Namespace) -> int:
    from gdncheck.env import limit_blas_threads

    limit_blas_threads()
    return {"build": _build, "check": _check, "list": _list, "path": _path, "export": _export}[args.action](args)


def _build(args) -> int:
    from gdncheck.errors import GDNError
    from gdncheck.fixtures.build import build_checkpoint_suite, build_suite
    from gdncheck.untrusted import folder_lock
    from gdncheck.writes import refuse_write_into_suite

    progress = None if args.quiet else print
    if args.from_checkpoint:
        if args.layer is None:
            raise GDNError("--from-checkpoint needs --layer N (the GDN layer to take)")
        out = args.out or f"fixtures-checkpoint-l{args.layer}"
        refuse_write_into_suite(out, "--out", builds_suite=True)  # before the build, not after it
        with folder_lock(out, "--out", beside=True):  # one writer per suite (beside it: a suite holds only its files)
            doc = build_checkpoint_suite(args.from_checkpoint, args.layer, out, prune=args.prune, progress=progress)
    else:
        out = args.out or f"fixtures-{args.suite}"
        refuse_write_into_suite(out, "--out", builds_suite=True)  # never a suite inside another
        with folder_lock(out, "--out", beside=True):
            doc = build_suite(args.suite, out, jobs=args.jobs, names=args.case, prune=args.prune, progress=progress)
    size = sum(c["bytes"] for c in doc["cases"])
    print(f"wrote manifest.json ({len(doc['cases'])} cases, {size / 1e6:.1f} MB) to {out}")
    return 0


def _check(args) -> int:
    from gdncheck.fixtures.build import check_suite
    from gdncheck.untrusted import safe_text

    report = check_suite(args.fixtures, jobs=args.jobs, checkpoint=args.checkpoint)
    unusable = [r for r in report if r["status"] == "unusable"]  # a bad manifest entry: exit 2, the rest checked
    bad = [r for r in report if r["status"] in ("changed", "missing")]
    for r in report:
        if not args.quiet or r in bad or r in unusable:
            print(safe_text(f"{r['status']:<17} {r['id']}: {r['detail']}"))
    near = sum(r["status"] == "numerically-equal" for r in report)
    checked = len(report) - len(unusable)
    print(f"{checked - len(bad)}/{checked} cases reproduce"
          + (f" ({near} numerically equal but not bit-identical: this platform broke the fixture guarantee, "
             "FORMAT.md §10)" if near else "")
          + ("" if not bad else f"; {len(bad)} changed: rebuild with gdncheck fixtures build and review the diff")
          + ("" if not unusable else f"; {len(unusable)} manifest entr{'y' if len(unusable) == 1 else 'ies'} "
                                     f"unusable (not checked; verify reports the same entries)"),
          file=sys.stdout)
    return 2 if unusable else 1 if bad else 0


def _list(args) -> int:
    from gdncheck.fixtures.coverage import coverage_of
    from gdncheck.fixtures.manifest import load_manifest
    from gdncheck.untrusted import safe_text

    m = load_manifest(args.fixtures)
    print(safe_text(f"suite {m['suite']}, format {m['format_version']}, {len(m['cases'])} cases"))
    for c in m["cases"]:
        extra = f" expects {c['expected_error']['code']}" if c["expected_error"] else ""
        features = coverage_of(c)["features"]
        extra += f"  may be n/a: {','.join(features)}" if features else ""
        print(safe_text(f"{c['id']:<52} {c['bytes'] / 1e6:6.2f} MB  {','.join(c['tags'])}{extra}"))
    return 0


def _path(args) -> int:
    from gdncheck.fixtures.packaged import default_suite

    print(default_suite())
    return 0


def _export(args) -> int:
    from gdncheck.fixtures.packaged import export_suite
    from gdncheck.untrusted import folder_lock
    from gdncheck.writes import refuse_write_into_suite

    refuse_write_into_suite(args.dest, "export folder", builds_suite=True)  # before the lock beside it is written
    with folder_lock(args.dest, "export folder", beside=True):  # one writer per folder (beside it: DIR must be empty)
        doc = export_suite(args.dest)
    if not args.quiet:
        size = sum(c["bytes"] for c in doc["cases"])
        print(f"exported the {doc['suite']} suite ({len(doc['cases'])} cases, {size / 1e6:.1f} MB, checksums verified) "
              f"to {args.dest}")
    return 0
