"""``gdncheck gpu-bench``: the Triton path's benchmark (same as ``python -m gdncheck.gpu_tools.bench``)."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Benchmark the Triton path on a CUDA GPU against ceilings measured in the same run (a device copy,
a tf32 and a bf16 GEMM): the decode kernel (Hk=16, Hv 32/48/64, dk=dv=128, B 1/64/256) against
the copy; a whole-layer decode step (B 1/64) plain and replayed from a CUDA graph; the chunked
prefill (B=1, T 8192/32768, Hv=32) against floors from the tf32 rate and the FLOPs the kernels
perform (and the minimal count); flash-linear-attention in its documented head layout when it
imports, its absence reported otherwise. --dry-run runs the same code on the CPU interpreter at
tiny sizes. scripts/gpu_check.sh runs it with the GPU tests and the compile table (docs/gpu.md)."""


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny sizes (checks the code path)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--markdown", metavar="PATH", help="also write the tables as Markdown")


def run(args: argparse.Namespace) -> int:
    from gdncheck.gpu_tools.bench import main

    return main((["--dry-run"] if args.dry_run else []) + (["--json", args.json] if args.json else [])
                + (["--markdown", args.markdown] if args.markdown else []))
