"""``gdncheck gpu-bench``: the Triton path's benchmark (same as ``python -m gdncheck.gpu_impl.bench``)."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Benchmark the Triton path's delta rule kernels on a CUDA GPU against a device-to-device copy and
a bf16 GEMM measured in the same run: decode (fused recurrent kernel, Hk=16, Hv 32/48/64,
dk=dv=128, B 1/64/256) and chunked prefill (B=1, T 8192/32768, Hv=32), with
flash-linear-attention as a ratio when it is importable. --dry-run runs the same code on the CPU
interpreter at tiny sizes. scripts/gpu_check.sh runs the conformance tests first."""


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny sizes (checks the code path)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")


def run(args: argparse.Namespace) -> int:
    from gdncheck.gpu_impl.bench import main

    return main((["--dry-run"] if args.dry_run else []) + (["--json", args.json] if args.json else []))
