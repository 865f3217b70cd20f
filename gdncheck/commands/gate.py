"""``gdncheck gate``: the CI conformance gate (gdncheck.gate)."""

from __future__ import annotations

import argparse
import sys

from gdncheck.profiles import VERIFY_PROFILES

from .console import Console

DESCRIPTION = """\
The CI conformance gate: does an implementation conform? With no arguments: the committed
fixtures, the Triton path, the device found here (Triton's interpreter without a GPU), every profile.

Steps: check the fixtures (checksums; for the committed suite a rebuild too, run in the workers
beside the first cases, the verdict waiting for it) and refuse drifted ones; run the implementation over the cases in every profile; verify; search the Hypothesis property
suite against the same implementation; write OUT/gate-summary.json, JUnit XML and the report; print
a table and the first divergences.

On Triton's interpreter the cases tagged `long` with over 1000 layer calls (the 2048-token decode)
are skipped, listed as skipped with the reason (--all-cases runs them); on a GPU everything runs.

--merge DIR [DIR ...] runs nothing: it merges the gate folders (--out) of the shards of a CI matrix
(--shard I/N) into one verdict, one OUT/gate-summary.json, one verify summary per profile, one JUnit
file and, with --report, one report; a set that is not one complete matrix is refused (exit 2, one
line): another implementation, suite, selection or settings, a shard missing or twice, a case in
two shards (a relabelled copy), a shard whose cases are not those its label selects. It takes no
shard's verdict on trust: each case is judged again from the shard's outputs files (DIR/PROFILE/)
against the suite the shards name (--fixtures DIR, else found by its manifest's sha256;
--fixtures-sha256 pins it; --xfails as the gate's); a missing outputs file, a link out of a shard, or
outputs that judge otherwise than the shard's summary says are refused (exit 2, naming shard and
case). Its --out, --junit and --report are checked as a gate's, and may not be, lie in or contain a
shard folder.

The outputs go to OUT/PROFILE/, folders the gate owns and replaces whole on each run (a folder there
that holds anything else is refused, as is an OUT that is, lies in or contains a fixture suite);
an earlier gate-summary.json is removed first (a file of that name, or gate-junit.xml, that gdncheck
did not write is refused, never removed). A suite other than the committed one is pinned with
--fixtures-sha256 (its manifest's sha256; the summary prints it).

Coverage: a run that judged nothing (every case skipped or not applicable), a case every port must
run declared not applicable, or a case that judged no tensor, never conforms.

Exit status: 0 conforms, 1 does not conform, 2 could not run (the reason is printed)."""


def _profiles(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--impl", default="triton", help="triton (default) | reference | MODULE:CALLABLE (docs/plugins.md)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="auto (default): cuda when torch sees a GPU, else cpu (the Triton interpreter)")
    p.add_argument("--profiles", type=_profiles, default=VERIFY_PROFILES, metavar="P[,P...]",
                   help=f"precision profiles, comma-separated (default {','.join(VERIFY_PROFILES)})")
    p.add_argument("--suite", default="default", choices=("default", "full"),
                   help="default: the committed fixtures; full: adds real Qwen3.5 sizes (built with "
                        "gdncheck fixtures build --suite full; looked for in ./fixtures-full)")
    p.add_argument("--fixtures", help="fixture folder (overrides --suite's; with --merge: the suite the shards "
                                      "were judged against, default found by its manifest's sha256)")
    p.add_argument("--fixtures-sha256", metavar="SHA256",
                   help="the sha256 of the suite's manifest.json: refuse any other (pin a suite other than the "
                        "committed one, whose integrity the gate cannot otherwise know)")
    p.add_argument("--case", action="append", help="only this case (id or id prefix; repeatable)")
    p.add_argument("--tag", action="append", help="only cases with this tag (repeatable)")
    p.add_argument("--shard", help="I/N: this runner's share (every N-th case and property unit from the I-th, "
                                   "0-based) of a CI matrix of N gates")
    p.add_argument("--all-cases", action="store_true", help="also run the cases skipped on the interpreter")
    p.add_argument("--out", default="gdncheck-out/gate",
                   help="folder for outputs, verify summaries and gate-summary.json (default gdncheck-out/gate)")
    p.add_argument("--junit", help="also write the JUnit XML here (always written to OUT/gate-junit.xml)")
    p.add_argument("--report", help="write the report here (summary.txt; the HTML report when available)")
    p.add_argument("--max-examples", type=int, help="Hypothesis examples per property (default 2 on the "
                                                    "interpreter, 10 elsewhere)")
    p.add_argument("--hypothesis-profile", choices=("dev", "ci", "nightly"),
                   help="default: GDN_HYPOTHESIS_PROFILE, else ci (derandomized: the same examples every run)")
    p.add_argument("--property", action="append", metavar="NAME", help="only properties whose name contains NAME")
    p.add_argument("--no-properties", action="store_true", help="skip the property suite")
    p.add_argument("--shrink", action="store_true", help="shrink failing property examples (slow on the "
                                                         "interpreter; the blob replays either way)")
    p.add_argument("--jobs", type=int, help="worker processes (default: 2 on a CPU, 1 on a GPU)")
    p.add_argument("--no-rebuild-check", action="store_true",
                   help="check the fixtures' checksums only, not a rebuild (default for suites other than the "
                        "committed one)")
    p.add_argument("--xfails", metavar="FILE", help="known failures (default: the packaged "
                   "gate/xfails.txt; 'none' for none); stale entries warn")
    p.add_argument("--option", action="append", metavar="KEY=VALUE", help="passed to the implementation's factory")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress, no per-case lines: the table, "
                                                              "failures and the verdict (for CI logs)")
    p.add_argument("--merge", nargs="+", metavar="DIR",
                   help="merge the gate folders of a matrix's shards (each one's --out, outputs files included: "
                        "every case is judged again from them) into --out; runs nothing")
    p.add_argument("--json", action="store_true",
                   help="write gate-summary.json's document to stdout too (human lines go to stderr)")


def _progress(quiet: bool, stream=sys.stdout):
    """A tqdm bar on a terminal; one line per unit elsewhere; nothing when quiet."""
    if quiet:
        return None, lambda: None
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=1.0, unit="", bar_format="{l_bar}{bar}| {elapsed}<{remaining} {postfix}", file=sys.stderr)

        def update(done, total, res):
            bar.total = total
            bar.n = done
            bar.set_postfix_str(_label(res), refresh=False)
            bar.refresh()

        return update, bar.close
    import time

    start = time.perf_counter()

    def line(done, total, res):
        if res["seconds"] < 0.5 and res.get("status") in ("ran", "raised", "pass"):
            return  # quick units (the expected-error cases) would flood a CI log
        el = time.perf_counter() - start
        eta = el * (total - done) / done if done else 0.0
        print(f"[{100 * done / total:5.1f}% {el:5.0f}s eta {eta:4.0f}s] {_label(res)}", file=stream, flush=True)

    return line, lambda: None


def _label(res: dict) -> str:
    from gdncheck.untrusted import safe_text

    if res["kind"] == "case":
        return safe_text(f"{res['profile']} {res['case']}: {res['status']} ({res['seconds']:.1f} s)")
    return safe_text(f"{res['profile']} property {res['name']}: {res['status']} ({res['seconds']:.1f} s)")


def run(args: argparse.Namespace) -> int:
    from gdncheck.commands.run import parse_shard
    from gdncheck.conformance.ports.plugin import parse_options
    from gdncheck.env import limit_blas_threads
    from gdncheck.gate import GateOptions, run_gate
    from gdncheck.gate.report import format_result, verdict_line
    from gdncheck.untrusted import safe_text

    limit_blas_threads()
    if args.merge:
        return _merge(args)
    opts = GateOptions(
        impl=args.impl, device=args.device, profiles=args.profiles, suite=args.suite, fixtures=args.fixtures,
        cases=args.case, tags=args.tag, shard=parse_shard(args.shard), out=args.out, junit=args.junit,
        report=args.report, properties=not args.no_properties, property_names=args.property,
        max_examples=args.max_examples, hypothesis_profile=args.hypothesis_profile, shrink=args.shrink,
        jobs=args.jobs, all_cases=args.all_cases, rebuild_check=False if args.no_rebuild_check else None,
        xfails=args.xfails, options=parse_options(args.option), fixtures_sha256=args.fixtures_sha256)
    con = Console(args)
    if not args.quiet:
        con.say(safe_text(f"gdncheck gate: {opts.impl} ({args.device}), profiles {','.join(opts.profiles)}, "
                          f"suite {opts.suite}" + (f", shard {args.shard}" if args.shard else "")
                          + f"; outputs in {opts.out}"))
    progress, close = _progress(args.quiet, con.stream)
    try:
        result = run_gate(opts, progress)
    finally:
        close()
    text = format_result(result.doc, verbose=True)  # port strings made visible text, line by line
    if text:
        con.say(text)
    con.say(verdict_line(result.doc))
    con.emit_json(result.doc)
    return result.exit_code


def _merge(args: argparse.Namespace) -> int:
    from gdncheck.gate.merge import merge_gates
    from gdncheck.gate.report import format_result, verdict_line

    con = Console(args)
    doc = merge_gates(args.merge, args.out, junit=args.junit, report=args.report, fixtures=args.fixtures,
                      fixtures_sha256=args.fixtures_sha256, xfails=args.xfails)
    con.progress(f"gdncheck gate: merged {len(doc['merged'])} shard(s): "
                 + ", ".join(f"{m['shard']} {m['verdict']}" for m in doc["merged"]))
    text = format_result(doc, verbose=True)
    if text:
        con.say(text)
    con.say(verdict_line(doc))
    con.emit_json(doc)
    return doc["exit_code"]
