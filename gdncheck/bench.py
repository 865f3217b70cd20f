"""Benchmarks of the float64 reference: ``python -m gdncheck.bench reference`` (or ``gdncheck bench``).

At real head sizes (Hk=16, Hv=32, dk=dv=128, D=2048, I=6144) and T in {1024, 4096, 16384} it measures,
in one run: the recurrent and the chunked delta rule, the whole layer, the layer's matmuls alone,
and Hugging Face transformers' ``torch_chunk_gated_delta_rule`` (fp32, CPU) on the same inputs when
transformers is installed. Each figure is the median wall time of ``--repeat`` runs and the peak
resident memory above the start of that measurement (Linux VmHWM, reset before each one).

Performance is measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .config import GDNConfig
from .env import limit_blas_threads

REAL = GDNConfig(hidden_size=2048, intermediate_size=6144, num_k_heads=16, num_v_heads=32, head_k_dim=128,
                 head_v_dim=128, conv_kernel=4)


def _rss_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def measure(fn: Callable[[], object], repeat: int) -> dict:
    """Median seconds over ``repeat`` runs, and peak RSS growth (MiB) during the first run."""
    times = []
    peak = None
    for i in range(repeat):
        if i == 0:
            _reset_peak()
            base = _rss_kb("VmRSS")
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        if i == 0:
            hwm = _rss_kb("VmHWM")
            if base is not None and hwm is not None:
                peak = max(0, hwm - base) / 1024
        del result
    return {"seconds": statistics.median(times), "runs": times, "peak_mib": peak}


def delta_inputs(cfg: GDNConfig, T: int, seed: int = 0):
    rng = np.random.default_rng(seed)

    def l2(x):
        return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)

    q = l2(rng.normal(size=(1, T, cfg.num_k_heads, cfg.head_k_dim)))
    k = l2(rng.normal(size=(1, T, cfg.num_k_heads, cfg.head_k_dim)))
    v = rng.normal(size=(1, T, cfg.num_v_heads, cfg.head_v_dim))
    g = -np.exp(rng.uniform(-1, 1, size=cfg.num_v_heads)) * np.logaddexp(0, rng.normal(size=(1, T, cfg.num_v_heads)))
    beta = 1 / (1 + np.exp(-rng.normal(size=(1, T, cfg.num_v_heads))))
    return q, k, v, g, beta


def hf_chunk_rule():
    """transformers' ``torch_chunk_gated_delta_rule`` or None when transformers is not installed."""
    try:
        from transformers.models.qwen3_5 import modeling_qwen3_5 as m
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None
    return getattr(m, "torch_chunk_gated_delta_rule", None)


def bench_reference(tokens: list[int], repeat: int, recurrent_max: int, layer_max: int, threads: int) -> dict:
    from .reference import Layer, delta_rule_chunked, delta_rule_recurrent
    from .synthetic import make_inputs, make_weights

    limit_blas_threads(threads)
    cfg = REAL
    rows = []
    hf = hf_chunk_rule()
    weights = make_weights(cfg, seed=0) if layer_max else None
    layer = Layer(cfg, weights) if weights is not None else None
    for T in tokens:
        q, k, v, g, beta = delta_inputs(cfg, T)
        row: dict = {"T": T}
        row["chunked"] = measure(lambda: delta_rule_chunked(q, k, v, g, beta, None, None, 64), repeat)
        if T <= recurrent_max:
            row["recurrent"] = measure(lambda: delta_rule_recurrent(q, k, v, g, beta, None, None), 1)
            o_r, s_r = delta_rule_recurrent(q, k, v, g, beta)
            o_c, s_c = delta_rule_chunked(q, k, v, g, beta)
            row["chunked_vs_recurrent_rel"] = float(
                max(np.abs(o_c - o_r).max() / np.abs(o_r).max(), np.abs(s_c - s_r).max() / np.abs(s_r).max())
            )
        if hf is not None:
            import torch

            torch.set_num_threads(threads)
            tq, tk, tv = (torch.from_numpy(a.astype(np.float32)) for a in (q, k, v))
            tg, tb = torch.from_numpy(g.astype(np.float32)), torch.from_numpy(beta.astype(np.float32))

            def run_hf():
                with torch.no_grad():
                    return hf(tq, tk, tv, g=tg, beta=tb, chunk_size=64, initial_state=None,
                              output_final_state=True, use_qk_l2norm_in_kernel=False)

            row["hf_torch_chunk_fp32"] = measure(run_hf, repeat)
        if layer is not None and T <= layer_max:
            x = make_inputs(cfg, 1, T, seed=1)
            row["layer"] = measure(lambda: layer.forward(x, layer.new_state(1), 0), repeat)
            row["layer_matmuls"] = measure(lambda: _layer_matmuls(layer, x), repeat)
        rows.append(row)
        print(_row_text(row), file=sys.stderr, flush=True)
    return {
        "config": cfg.summary(),
        "threads": threads,
        "numpy": np.__version__,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "transformers": _version("transformers") if hf is not None else None,
        "rows": rows,
    }


def _layer_matmuls(layer, x: np.ndarray):
    """Exactly the layer's matrix products, on float64 operands of the same shapes."""
    p = layer.params
    xn = x[0]
    outs = [xn @ p[n].T for n in ("linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight",
                                  "linear_attn.in_proj_a.weight", "linear_attn.in_proj_b.weight")]
    outs.append(outs[1] @ p["linear_attn.out_proj.weight"].T)
    gate = xn @ p["mlp.gate_proj.weight"].T
    up = xn @ p["mlp.up_proj.weight"].T
    outs.append((gate * up) @ p["mlp.down_proj.weight"].T)
    return outs


def _version(pkg: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(pkg)
    except Exception:  # noqa: BLE001
        return None


def _fmt(m: dict | None) -> str:
    if not m:
        return "-"
    peak = f"{m['peak_mib']:.0f} MiB" if m.get("peak_mib") is not None else "? MiB"
    return f"{m['seconds']:.3f} s / {peak}"


def _row_text(row: dict) -> str:
    parts = [f"T={row['T']:>6}"]
    for key in ("recurrent", "chunked", "hf_torch_chunk_fp32", "layer", "layer_matmuls"):
        if key in row:
            parts.append(f"{key}: {_fmt(row[key])}")
    if "chunked_vs_recurrent_rel" in row:
        parts.append(f"rel err {row['chunked_vs_recurrent_rel']:.1e}")
    return "  ".join(parts)


def table(result: dict) -> str:
    lines = [
        f"float64 reference, {result['config']}, BLAS threads {result['threads']}, numpy {result['numpy']}",
        f"{'T':>6} | {'recurrent':>18} | {'chunked C=64':>18} | {'HF torch fp32':>18} | {'chunked/HF':>10} | "
        f"{'layer':>18} | {'matmuls':>18} | {'layer/mm':>8}",
    ]
    for r in result["rows"]:
        ratio = (f"{r['chunked']['seconds'] / r['hf_torch_chunk_fp32']['seconds']:.2f}x"
                 if "hf_torch_chunk_fp32" in r else "-")
        lm = (f"{r['layer']['seconds'] / r['layer_matmuls']['seconds']:.2f}x" if "layer" in r else "-")
        lines.append(
            f"{r['T']:>6} | {_fmt(r.get('recurrent')):>18} | {_fmt(r.get('chunked')):>18} | "
            f"{_fmt(r.get('hf_torch_chunk_fp32')):>18} | {ratio:>10} | {_fmt(r.get('layer')):>18} | "
            f"{_fmt(r.get('layer_matmuls')):>18} | {lm:>8}"
        )
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="?", default="reference", choices=["reference"], help="what to benchmark")
    p.add_argument("--tokens", default="1024,4096,16384", help="comma-separated T values")
    p.add_argument("--repeat", type=int, default=3, help="runs per figure (median reported)")
    p.add_argument("--recurrent-max", type=int, default=4096, help="largest T for the (slow) recurrent form")
    p.add_argument("--layer-max", type=int, default=16384, help="largest T for the whole layer (0: skip)")
    p.add_argument("--threads", type=int, default=None, help="BLAS/torch threads (default GDN_BLAS_THREADS or 1)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")


def run_from_args(args: argparse.Namespace) -> int:
    from .env import blas_threads

    tokens = [int(t) for t in str(args.tokens).split(",") if t.strip()]
    result = bench_reference(tokens, args.repeat, args.recurrent_max, args.layer_max, args.threads or blas_threads())
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gdncheck.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run_from_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
