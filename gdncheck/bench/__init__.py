"""Benchmarks of the float64 reference: `python -m gdncheck.bench reference` (or `gdncheck bench`),
`python -m gdncheck.bench serving` (a packed call of 8 sequences against the equivalent separate
calls, `gdncheck.bench.serving`) and `python -m gdncheck.bench moe` (the mixture-of-experts block
against its GEMMs alone, `gdncheck.bench.moe`).

At real head sizes it times, per thread count (`--threads 1,2`), the chunked and recurrent delta
rule, transformers' `torch_chunk_gated_delta_rule` when installed, and the whole layer against its
matmuls alone; medians of `--repeat` runs, peak resident-memory growth, the load average.
`--quick` runs a tiny layer (a smoke test). Performance is measured here, never asserted in tests.

What each row measures and the figures: README.md, "Benchmarks"; docs/moe.md, "Benchmark".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gdncheck.config import REAL
from gdncheck.untrusted import OneLineParser

from .common import QUICK
from .reference import bench_reference, table


# --- command line -----------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="?", default="reference", choices=["reference", "serving", "moe"],
                   help="what to benchmark: the reference's stages and layer, its packed serving call (serving), "
                        "or the MoE block (moe)")
    p.add_argument("--lengths", type=_lengths, default=None,
                   help="serving: comma-separated sequence lengths (default 1,17,64,65,256,700,1500,2048)")
    p.add_argument("--tokens", default=None,
                   help="comma-separated T values (default 1024,4096,16384; moe: 4096)")
    p.add_argument("--repeat", type=int, default=None, help="runs per figure, median reported (default 3)")
    p.add_argument("--recurrent-max", type=int, default=4096, help="largest T for the (slow) recurrent form")
    p.add_argument("--layer-max", type=int, default=16384, help="largest T for the whole layer (0: skip)")
    p.add_argument("--threads", default=None,
                   help="comma-separated BLAS and torch thread counts, e.g. 1,2 (default GDN_BLAS_THREADS or 1)")
    p.add_argument("--no-hf", action="store_true", help="skip the transformers comparison")
    p.add_argument("--numpy-hugepage", choices=["off", "on"], default="off",
                   help="numpy's madvise(MADV_HUGEPAGE) on large arrays (NUMPY_MADVISE_HUGEPAGE); default off: "
                        "with THP defrag=madvise it can stall first touches in compaction (numpy#31590)")
    p.add_argument("--quick", action="store_true",
                   help="a tiny layer (D=32, Hk=2, Hv=4) at T=16,40, one run each: checks the code path only")
    p.add_argument("--experts-in-memory", type=int, default=None,
                   help="moe: distinct float64 expert weight sets held (expert e uses set e mod P); default all "
                        "512 (12.9 GB) when MemAvailable has 1.5x that, else 64")
    p.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")


def _lengths(text: str) -> list[int]:
    try:
        lengths = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        lengths = []
    if not lengths or min(lengths) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated sequence lengths >= 1, found {text!r}")
    return lengths


def run_from_args(args: argparse.Namespace) -> int:
    from ..env import blas_threads
    from ..writes import refuse_write_into_suite

    if args.json:  # refused before the minutes of measuring, not after them
        refuse_write_into_suite(args.json, "--json")

    if args.target == "serving":
        from . import serving

        threads = [int(t) for t in str(args.threads).split(",") if t.strip()] if args.threads else [blas_threads()]
        result = serving.run(args, threads)
        print(serving.table(result))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return 0
    tokens_default, repeat_default = ("16,40", 1) if args.quick else ("1024,4096,16384", 3)
    if args.target == "moe" and not args.quick:
        tokens_default = "4096"
    tokens = [int(t) for t in str(args.tokens or tokens_default).split(",") if t.strip()]
    threads = [int(t) for t in str(args.threads).split(",") if t.strip()] if args.threads else [blas_threads()]
    if args.target == "moe":
        from .moe import MOE_QUICK, MOE_REAL, bench_moe, moe_table

        result = bench_moe(tokens, args.repeat or repeat_default, threads, MOE_QUICK if args.quick else MOE_REAL,
                           args.experts_in_memory)
        print(moe_table(result))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return 0
    result = bench_reference(tokens, args.repeat or repeat_default, args.recurrent_max, args.layer_max, threads,
                             cfg=QUICK if args.quick else REAL, use_hf=not args.no_hf,
                             numpy_hugepage=args.numpy_hugepage == "on")
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m gdncheck.bench", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run_from_args(p.parse_args(argv))
