"""Benchmark of the Triton path's delta rule kernels against the machine's own ceilings.

    python -m gdncheck.gpu_impl.bench              # on a CUDA GPU (scripts/gpu_check.sh runs it)
    python -m gdncheck.gpu_impl.bench --dry-run    # same code path, CPU interpreter, tiny sizes

Measured in the same run: a device-to-device copy (bandwidth ceiling, bytes read + written) and a
bf16 GEMM (compute ceiling). Then:

- decode: the fused recurrent kernel, T = 1, state updated in place, Hk = 16, Hv ∈ {32, 48, 64},
  dk = dv = 128, B ∈ {1, 64, 256}: µs, GB/s of state traffic (2·B·Hv·dk·dv·4 bytes), % of copy;
- prefill: the chunked pipeline, B = 1, T ∈ {8192, 32768}, Hv = 32, C = 64, bf16: ms, tokens/s,
  TFLOP/s by the real count F(C) = 6·dk·dv + 6·C·dk + 4·C·dv + C²/3 per token and value head
  (research/perf-anchors.md §3.2), the compute floor F·T·Hv / GEMM rate, and time / floor;
- flash-linear-attention's ``fused_recurrent_gated_delta_rule`` and ``chunk_gated_delta_rule`` on
  the same inputs when ``fla`` is importable: FLA time / ours (> 1: ours is faster) and the
  largest relative difference of the outputs. Measured after our table is printed (FLA
  autotunes on first use); the table is then printed again with these two columns.

GPU times come from ``triton.testing.do_bench`` (CUDA events, median); CPU times are wall-clock
medians. Goals (issue 3): decode at B = 64 ≥ 70 % of the copy; prefill ≤ 5× the floor and at
least as fast as FLA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from functools import partial

import torch

from .delta_rule import delta_rule_recurrent
from .delta_rule_chunked import delta_rule_chunked
from .target import resolve_device


@dataclass(frozen=True)
class Sizes:
    Hk: int
    Hv_decode: tuple[int, ...]
    Hv_prefill: int
    dk: int
    batches: tuple[int, ...]
    tokens: tuple[int, ...]
    chunk: int
    copy_bytes: int
    gemm: int


GPU = Sizes(Hk=16, Hv_decode=(32, 48, 64), Hv_prefill=32, dk=128, batches=(1, 64, 256), tokens=(8192, 32768),
            chunk=64, copy_bytes=1 << 30, gemm=8192)
DRY = Sizes(Hk=2, Hv_decode=(4,), Hv_prefill=4, dk=16, batches=(1, 2), tokens=(64,), chunk=16,
            copy_bytes=1 << 22, gemm=128)


def flops_per_token_head(C: int, dk: int, dv: int) -> float:
    """F(C): real FLOPs of the chunked form per token and value head (perf-anchors §3.2)."""
    return 6 * dk * dv + 6 * C * dk + 4 * C * dv + C * C / 3


def timer(device: torch.device, repeat: int):
    """fn -> seconds (median)."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3

    def cpu(fn):
        fn()
        runs = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t0)
        return statistics.median(runs)

    return cpu


def fla_ops():
    """(fused_recurrent, chunk) of flash-linear-attention, or None when it is not importable."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None
    return fused_recurrent_gated_delta_rule, chunk_gated_delta_rule


def delta_inputs(B: int, T: int, Hk: int, Hv: int, d: int, device, dtype=torch.bfloat16, seed: int = 0):
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    q = torch.nn.functional.normalize(randn(B, T, Hk, d), dim=-1).to(device, dtype)
    k = torch.nn.functional.normalize(randn(B, T, Hk, d), dim=-1).to(device, dtype)
    v = randn(B, T, Hv, d).to(device, dtype)
    g = (-torch.nn.functional.softplus(randn(B, T, Hv)) * torch.rand(Hv, generator=gen) * 2).to(device)
    beta = torch.sigmoid(randn(B, T, Hv)).to(device)
    return q, k, v, g, beta


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def ceilings(s: Sizes, device, measure) -> dict:
    n = s.copy_bytes // 4
    src = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    t_copy = measure(partial(dst.copy_, src))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(s.gemm, s.gemm, device=device, dtype=dtype)
    b = torch.randn(s.gemm, s.gemm, device=device, dtype=dtype)
    t_gemm = measure(partial(torch.matmul, a, b))
    return {"copy_GBps": 2 * s.copy_bytes / t_copy / 1e9, "gemm_TFLOPs": 2 * s.gemm ** 3 / t_gemm / 1e12,
            "gemm_dtype": str(dtype).removeprefix("torch.")}


def decode_inputs(s: Sizes, Hv: int, B: int, device):
    q, k, v, g, beta = delta_inputs(B, 1, s.Hk, Hv, s.dk, device)
    return q, k, v, g, beta, torch.randn(B, Hv, s.dk, s.dk, device=device) * 0.1


def bench_decode(s: Sizes, device, measure, ceil: dict) -> list[dict]:
    rows = []
    for Hv in s.Hv_decode:
        for B in s.batches:
            q, k, v, g, beta, S = decode_inputs(s, Hv, B, device)
            t = measure(partial(delta_rule_recurrent, q, k, v, g, beta, S, None, out_state=S))
            gbps = 2 * B * Hv * s.dk * s.dk * 4 / t / 1e9
            rows.append({"Hv": Hv, "B": B, "us": t * 1e6, "GBps": gbps, "pct_copy": 100 * gbps / ceil["copy_GBps"]})
    return rows


def _fla_decode(fused_recurrent, q, k, v, g, beta, S, measure, t_ours) -> dict:
    try:
        h0 = S.clone()
        t = measure(partial(fused_recurrent, q=q, k=k, v=v, g=g, beta=beta, initial_state=h0,
                            output_final_state=True))
        ours, _ = delta_rule_recurrent(q, k, v, g, beta, S.clone())
        theirs, _ = fused_recurrent(q=q, k=k, v=v, g=g, beta=beta, initial_state=S.clone(), output_final_state=True)
        return {"fla_over_ours": t / t_ours, "fla_rel_diff": rel_diff(ours, theirs)}
    except Exception as exc:  # noqa: BLE001 - report, do not abort the table
        return {"fla_error": f"{type(exc).__name__}: {exc}"[:120]}


def bench_prefill(s: Sizes, device, measure, ceil: dict) -> list[dict]:
    rows = []
    F = flops_per_token_head(s.chunk, s.dk, s.dk)
    for T in s.tokens:
        q, k, v, g, beta = delta_inputs(1, T, s.Hk, s.Hv_prefill, s.dk, device)
        t = measure(partial(delta_rule_chunked, q, k, v, g, beta, None, None, s.chunk))
        flop = F * T * s.Hv_prefill
        floor = flop / (ceil["gemm_TFLOPs"] * 1e12)
        rows.append({"T": T, "Hv": s.Hv_prefill, "ms": t * 1e3, "Mtok_s": T / t / 1e6, "TFLOPs": flop / t / 1e12,
                     "floor_ms": floor * 1e3, "x_floor": t / floor})
    return rows


def bench_fla(s: Sizes, device, measure, result: dict, fla) -> None:
    """Add FLA time / ours and the outputs' largest relative difference to every row (in place).

    Run after our own table is printed: FLA autotunes on first use, which can take a while."""
    fused_recurrent, chunk_rule = fla
    for row in result["decode"]:
        q, k, v, g, beta, S = decode_inputs(s, row["Hv"], row["B"], device)
        row.update(_fla_decode(fused_recurrent, q, k, v, g, beta, S, measure, row["us"] * 1e-6))
    for row in result["prefill"]:
        q, k, v, g, beta = delta_inputs(1, row["T"], s.Hk, s.Hv_prefill, s.dk, device)
        row.update(_fla_prefill(chunk_rule, q, k, v, g, beta, s.chunk, measure, row["ms"] * 1e-3))


def _fla_prefill(chunk_rule, q, k, v, g, beta, C, measure, t_ours) -> dict:
    try:
        t = measure(partial(chunk_rule, q=q, k=k, v=v, g=g, beta=beta, output_final_state=True))
        ours, _ = delta_rule_chunked(q, k, v, g, beta, None, None, C)
        theirs, _ = chunk_rule(q=q, k=k, v=v, g=g, beta=beta, output_final_state=True)
        return {"fla_over_ours": t / t_ours, "fla_rel_diff": rel_diff(ours, theirs)}
    except Exception as exc:  # noqa: BLE001 - report, do not abort the table
        return {"fla_error": f"{type(exc).__name__}: {exc}"[:120]}


def _fla_cells(row: dict) -> str:
    if "fla_over_ours" in row:
        return f" {row['fla_over_ours']:>9.2f}x {row['fla_rel_diff']:>9.1e}"
    if "fla_error" in row:
        return f" {'error':>10}  ({row['fla_error']})"
    return ""


def report(result: dict) -> str:
    c = result["ceilings"]
    with_fla = any("fla_over_ours" in r or "fla_error" in r for r in result["decode"] + result["prefill"])
    fla_head = f" {'FLA/ours':>10} {'rel diff':>9}" if with_fla else ""
    lines = [
        f"gdncheck.gpu_impl.bench on {result['device_name']} ({result['mode']}); torch {result['torch']}, "
        f"triton {result['triton']}; flash-linear-attention: {result['fla']}",
        f"ceilings measured now: copy {c['copy_GBps']:.0f} GB/s (read + write), "
        f"{c['gemm_dtype']} GEMM {c['gemm_TFLOPs']:.1f} TFLOP/s",
        "",
        "decode: fused recurrent kernel, T=1, fp32 state in place, bf16 q/k/v",
        f"{'Hv':>4} {'B':>5} {'us':>10} {'GB/s':>9} {'% copy':>7}" + fla_head,
    ]
    for r in result["decode"]:
        lines.append(f"{r['Hv']:>4} {r['B']:>5} {r['us']:>10.2f} {r['GBps']:>9.1f} {r['pct_copy']:>6.1f}%"
                     + _fla_cells(r))
    lines += ["", f"prefill: chunked WY pipeline, B=1, C={result['chunk']}, bf16 inputs (dots: tf32), "
              "FLOPs by F(C)",
              f"{'T':>6} {'Hv':>3} {'ms':>9} {'Mtok/s':>8} {'TFLOP/s':>8} {'floor ms':>9} {'x floor':>8}"
              + fla_head]
    for r in result["prefill"]:
        lines.append(f"{r['T']:>6} {r['Hv']:>3} {r['ms']:>9.3f} {r['Mtok_s']:>8.2f} {r['TFLOPs']:>8.1f} "
                     f"{r['floor_ms']:>9.4f} {r['x_floor']:>8.1f}" + _fla_cells(r))
    return "\n".join(lines)


def run(dry_run: bool = False, json_path: str | None = None) -> dict:
    dev = resolve_device("cpu" if dry_run else None)
    if dev.type != "cuda" and not dry_run:
        raise SystemExit("gdncheck.gpu_impl.bench: no CUDA device; use --dry-run for the CPU interpreter")
    s = DRY if dry_run else GPU
    measure = timer(dev, repeat=3)
    fla = fla_ops() if dev.type == "cuda" else None
    import triton

    ceil = ceilings(s, dev, measure)
    result = {
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (Triton interpreter)",
        "mode": "dry run, tiny sizes" if dry_run else "full sizes",
        "torch": torch.__version__, "triton": triton.__version__,
        "fla": "imported" if fla else "not importable" if dev.type == "cuda" else "not used on the CPU",
        "chunk": s.chunk, "ceilings": ceil,
        "decode": bench_decode(s, dev, measure, ceil),
        "prefill": bench_prefill(s, dev, measure, ceil),
    }
    _emit(result, json_path)
    if fla is not None:
        print("\nflash-linear-attention on the same inputs (its first calls autotune) ...", flush=True)
        bench_fla(s, dev, measure, result, fla)
        _emit(result, json_path)
    return result


def _emit(result: dict, json_path: str | None) -> None:
    print(report(result), flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gdncheck.gpu_impl.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny sizes (checks the code path)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    run(dry_run=args.dry_run, json_path=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
