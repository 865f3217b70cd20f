"""Benchmarks of the float64 reference: ``python -m gdncheck.bench reference`` (or ``gdncheck bench``).

At real head sizes (Hk=16, Hv=32, dk=dv=128, D=2048, I=6144) and T in {1024, 4096, 16384} it measures,
in one run and for each thread count asked for (``--threads 1,2``):

- the chunked delta rule (C=64) and, up to ``--recurrent-max`` tokens, the recurrent one, with their
  normwise relative difference (max |chunked − recurrent| / max |recurrent|, output and final state);
- Hugging Face transformers' ``torch_chunk_gated_delta_rule`` (fp32, CPU, C=64) on the same inputs, when
  transformers is installed, with its normwise error against the float64 result;
- the whole layer (``Layer.forward``) and its matmuls alone: every matrix product of the layer on float64
  operands of the same shapes, the projections and the products of the chunked delta rule's formula
  (KKᵀ, QKᵀ, [Q; K] S, (I + A)⁻¹ Y, Kᵀ V', (QKᵀ ⊙ E) V'), batched as the reference batches them.

Each time is the median wall time of ``--repeat`` runs (the recurrent form: one run); what is compared
(chunked and HF, layer and its matmuls) runs in turns, so that a busy neighbour slows both alike, and
the load average before and after each row is recorded. Each peak memory is the growth of the
process's peak resident set (Linux VmHWM, reset before each measurement) over the resident set at its
start. BLAS threads are set with threadpoolctl, torch threads with
``torch.set_num_threads``. ``--quick`` runs the same code on a tiny layer (a smoke test, not a benchmark).

``moe`` benchmarks the float64 mixture-of-experts block against its GEMMs alone instead
(:mod:`gdncheck.bench_moe`: 512 experts, 10 active, D = 2048, T = 4096 by default).

Performance is measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from .config import GDNConfig

REAL = GDNConfig(hidden_size=2048, intermediate_size=6144, num_k_heads=16, num_v_heads=32, head_k_dim=128,
                 head_v_dim=128, conv_kernel=4)
QUICK = GDNConfig(hidden_size=32, intermediate_size=48, num_k_heads=2, num_v_heads=4, head_k_dim=16,
                  head_v_dim=8, conv_kernel=4)
CHUNK = 64
MEASURES = ("recurrent", "chunked", "hf_torch_chunk_fp32", "layer", "layer_matmuls")


# --- measuring ----------------------------------------------------------------------------------------
def _rss_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> None:
    """Free what can be freed, then restart the peak resident set count (VmHWM) at the current one."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def measure(fns: dict[str, Callable[[], object]], repeat: int, keep: bool = True) -> tuple[dict, dict]:
    """Run each function ``repeat`` times, taking turns (a, b, a, b, ...), so that a busy neighbour on a
    shared machine slows them alike. Per function: the median and least wall seconds, the median CPU
    seconds of the process (all its threads; kernel time such as page faults included), the median
    kernel (system) seconds alone, and the peak memory growth (MiB) of its first run.

    Returns the figures and (``keep``) the result of each function's last run, by name.
    """
    times: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    sys_: dict[str, list[float]] = {name: [] for name in fns}
    peaks: dict[str, float | None] = {}
    results: dict[str, object] = {}
    for i in range(repeat):
        for name, fn in fns.items():
            results[name] = None
            if i == 0:
                _reset_peak()
                base = _rss_kb("VmRSS")
            t0, c0, s0 = time.perf_counter(), time.process_time(), os.times().system
            result = fn()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            sys_[name].append(os.times().system - s0)
            if keep:
                results[name] = result
            del result
            if i == 0:
                hwm = _rss_kb("VmHWM")
                peaks[name] = max(0, hwm - base) / 1024 if base is not None and hwm is not None else None
    figures = {name: {"seconds": statistics.median(ts), "min_seconds": min(ts), "runs": ts,
                      "cpu_seconds": statistics.median(cpu[name]), "sys_seconds": statistics.median(sys_[name]),
                      "peak_mib": peaks[name]}
               for name, ts in times.items()}
    return figures, results


def normwise(a: np.ndarray, ref: np.ndarray) -> float:
    """max |a − ref| / max |ref| (0 when both are all zeros)."""
    den = float(np.abs(ref).max()) if ref.size else 0.0
    num = float(np.abs(np.asarray(a, dtype=np.float64) - ref).max()) if ref.size else 0.0
    return num / den if den else num


# --- inputs and implementations ---------------------------------------------------------------------
def delta_inputs(cfg: GDNConfig, T: int, seed: int = 0):
    """q, k (L2-normalised), v, g < 0, beta in (0, 1) for one sequence of T tokens, float64."""
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


def layer_matmuls(layer, x: np.ndarray, chunk_size: int = CHUNK) -> Callable[[], object]:
    """A function doing every matrix product of ``layer.forward(x)`` alone, on float64 operands of the
    same shapes: the projections (in_proj ×4, out_proj, mlp ×3) and the products of the chunked delta
    rule (:func:`_delta_rule_matmuls`). Operands are made here, outside what is timed."""
    from .reference.delta_rule_chunked import BLOCK_TOKENS

    cfg, p = layer.cfg, layer.params
    B, T, _ = x.shape
    w = {n: p[n].T for n in ("linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight",
                             "linear_attn.in_proj_a.weight", "linear_attn.in_proj_b.weight",
                             "linear_attn.out_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                             "mlp.down_proj.weight")}
    delta = _delta_rule_operands(cfg, B, T, chunk_size, BLOCK_TOKENS)

    def run():
        qkv = x @ w["linear_attn.in_proj_qkv.weight"]
        z = x @ w["linear_attn.in_proj_z.weight"]  # [B, T, Hv·dv], the shape of core_gated
        a = x @ w["linear_attn.in_proj_a.weight"]
        b = x @ w["linear_attn.in_proj_b.weight"]
        _delta_rule_matmuls(delta)
        attn_out = z @ w["linear_attn.out_proj.weight"]
        gate = x @ w["mlp.gate_proj.weight"]  # [B, T, I], the shape of silu(gate) * up
        up = x @ w["mlp.up_proj.weight"]
        mlp_out = gate @ w["mlp.down_proj.weight"]
        return qkv, a, b, attn_out, up, mlp_out

    return run


def _delta_rule_operands(cfg: GDNConfig, B: int, T: int, C: int, block_tokens: int) -> list[dict]:
    """Operands for :func:`_delta_rule_matmuls`, one set per block shape, blocks split like
    reference/delta_rule_chunked.py (whole chunks of C per block, a last partial chunk alone)."""
    Hk, Hv, dk, dv = cfg.num_k_heads, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim
    r = Hv // Hk
    rng = np.random.default_rng(0)
    S = rng.normal(size=(B, Hk, r, dk, dv))
    blocks, made = [], {}
    step = max(1, block_tokens // C) * C
    for t0 in range(0, T, step):
        t1 = min(T, t0 + step)
        whole = t0 + (t1 - t0) // C * C
        for a, b in ((t0, whole), (whole, t1)):
            if b > a:
                L = min(C, b - a)
                n = (b - a) // L
                if (n, L) not in made:
                    made[(n, L)] = {
                        "QK": rng.normal(size=(B, Hk, 1, n, 2 * L, dk)), "S": S,
                        "T_inv": rng.normal(size=(B, Hk, r, n, L, L)),  # also stands for QKᵀ ⊙ E
                        "Y": rng.normal(size=(B, Hk, r, L, dv)), "Vn": np.empty((B, Hk, r, n, L, dv)),
                    }
                blocks.append(made[(n, L)])
    return blocks


def _delta_rule_matmuls(blocks: list[dict]) -> None:
    """The products of the chunked formula, batched like reference/delta_rule_chunked.py: per block
    KKᵀ and QKᵀ per key head; per chunk [Q; K] S, (I + A)⁻¹ Y and Kᵀ Y; per block (QKᵀ ⊙ E) V'."""
    for op in blocks:
        QK, S, T_inv, Y, Vn = op["QK"], op["S"], op["T_inv"], op["Y"], op["Vn"]
        L = T_inv.shape[-1]
        Kt = np.swapaxes(QK[..., L:, :], -1, -2)
        np.matmul(QK[..., L:, :], Kt)  # K Kᵀ
        np.matmul(QK[..., :L, :], Kt)  # Q Kᵀ
        for j in range(QK.shape[3]):
            np.matmul(QK[..., j, :, :], S)  # [Q; K] S
            np.matmul(T_inv[..., j, :, :], Y, out=Vn[..., j, :, :])  # (I + A)⁻¹ Y
            np.matmul(Kt[..., j, :, :], Y)  # Kᵀ Y
        np.matmul(T_inv, Vn)  # (QKᵀ ⊙ E) V'


# --- the benchmark ----------------------------------------------------------------------------------
def thread_info() -> dict:
    """What actually runs: BLAS libraries with their thread counts, torch's thread count."""
    info: dict = {"cpus": os.cpu_count()}
    try:
        from threadpoolctl import threadpool_info

        info["blas"] = [f"{d.get('internal_api')} {d.get('version')} threads={d.get('num_threads')}"
                        for d in threadpool_info() if d.get("user_api") == "blas"]
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        info["blas"] = []
    if "torch" in sys.modules:
        info["torch_threads"] = sys.modules["torch"].get_num_threads()
    return info


def bench_reference(tokens: list[int], repeat: int, recurrent_max: int, layer_max: int,
                    threads: list[int], cfg: GDNConfig = REAL, use_hf: bool = True,
                    numpy_hugepage: bool | None = None) -> dict:
    """The figures of the module docstring, one row per (thread count, T). ``numpy_hugepage``: set numpy's
    madvise-hugepage switch for the run (None: leave it), restored afterwards."""
    previous = _numpy_hugepage(numpy_hugepage)
    try:
        return _bench_reference(tokens, repeat, recurrent_max, layer_max, threads, cfg, use_hf)
    finally:
        _numpy_hugepage(previous)


def _numpy_hugepage(enable: bool | None) -> bool | None:
    """Set numpy's madvise(MADV_HUGEPAGE) switch (what NUMPY_MADVISE_HUGEPAGE sets at import) unless
    ``enable`` is None; return the previous setting (None where numpy has no such switch)."""
    try:
        from numpy._core.multiarray import _get_madvise_hugepage, _set_madvise_hugepage
    except ImportError:  # pragma: no cover - numpy < 2 or not Linux
        return None
    return bool(_set_madvise_hugepage(enable)) if enable is not None else bool(_get_madvise_hugepage())


def _bench_reference(tokens: list[int], repeat: int, recurrent_max: int, layer_max: int,
                     threads: list[int], cfg: GDNConfig, use_hf: bool) -> dict:
    from threadpoolctl import threadpool_limits

    from .reference import Layer, delta_rule_chunked, delta_rule_recurrent
    from .synthetic import make_inputs, make_weights

    hf = hf_chunk_rule() if use_hf else None
    layer = Layer(cfg, make_weights(cfg, seed=0)) if layer_max else None
    rows = []
    for n_threads in threads:
        limiter = threadpool_limits(limits=n_threads, user_api="blas")
        if hf is not None:
            import torch

            torch.set_num_threads(n_threads)
        for T in tokens:
            row: dict = {"T": T, "threads": n_threads, "load_before": _load()}
            inputs = delta_inputs(cfg, T)
            fns = {"chunked": partial(delta_rule_chunked, *inputs, chunk_size=CHUNK)}
            if hf is not None:
                fns["hf_torch_chunk_fp32"] = _hf_runner(hf, *inputs)
            figures, results = measure(fns, repeat)
            row.update(figures)
            o_c, s_c = results["chunked"]
            if hf is not None:
                o_h, s_h = results["hf_torch_chunk_fp32"]
                row["hf_vs_chunked"] = max(normwise(o_h.numpy(), o_c), normwise(s_h.numpy(), s_c))
                del o_h, s_h
            del results, figures
            if T <= recurrent_max:
                figures, results = measure({"recurrent": partial(delta_rule_recurrent, *inputs)}, 1)
                row.update(figures)
                o_r, s_r = results["recurrent"]
                row["chunked_vs_recurrent"] = max(normwise(o_c, o_r), normwise(s_c, s_r))
                del results, figures, o_r, s_r
            del o_c, s_c, inputs
            if layer is not None and T <= layer_max:
                x = make_inputs(cfg, 1, T, seed=1)
                figures, _ = measure({"layer": lambda: layer.forward(x, layer.new_state(1), 0),
                                      "layer_matmuls": layer_matmuls(layer, x)}, repeat, keep=False)
                row.update(figures)
                del x
            row["load_after"] = _load()
            row["env"] = thread_info()
            rows.append(row)
            print(_row_text(row), file=sys.stderr, flush=True)
        limiter.restore_original_limits()
    return {
        "config": cfg.summary(),
        "chunk_size": CHUNK,
        "repeat": repeat,
        "threads": threads,
        "numpy": np.__version__,
        "numpy_madvise_hugepage": _numpy_hugepage(None),
        "torch": _version("torch") if hf is not None else None,
        "transformers": _version("transformers") if hf is not None else None,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "rows": rows,
    }


def _hf_runner(hf, q, k, v, g, beta):
    import torch

    tq, tk, tv, tg, tb = (torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)) for a in (q, k, v, g, beta))

    def run():
        with torch.no_grad():
            return hf(tq, tk, tv, g=tg, beta=tb, chunk_size=CHUNK, initial_state=None,
                      output_final_state=True, use_qk_l2norm_in_kernel=False)

    return run


def _load() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (how busy the machine was), or None."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _version(pkg: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(pkg)
    except Exception:  # noqa: BLE001
        return None


# --- reporting --------------------------------------------------------------------------------------
def _fmt(m: dict | None) -> str:
    if not m:
        return "-"
    peak = f"{m['peak_mib']:.0f} MiB" if m.get("peak_mib") is not None else "? MiB"
    return f"{m['seconds']:.3f} s / {peak}"


def _ratio(row: dict, num: str, den: str) -> str:
    """Ratio of median wall times, then of median CPU times (which a busy neighbour barely changes)."""
    if num not in row or den not in row:
        return "-"
    return (f"{row[num]['seconds'] / row[den]['seconds']:.2f}x "
            f"(cpu {row[num]['cpu_seconds'] / row[den]['cpu_seconds']:.2f}x)")


def _err(row: dict, key: str) -> str:
    return f"{row[key]:.1e}" if key in row else "-"


def _load_text(row: dict) -> str:
    before, after = row.get("load_before"), row.get("load_after")
    return f"{before[0]:.1f}→{after[0]:.1f}" if before and after else "-"


def _row_text(row: dict) -> str:
    parts = [f"T={row['T']:>6} threads={row['threads']}"]
    parts += [f"{key}: {_fmt(row[key])}" for key in MEASURES if key in row]
    return "  ".join(parts)


def table(result: dict) -> str:
    """The figures as a Markdown table (time / peak memory growth per measurement)."""
    head = ["T", "threads", "recurrent", "chunked C=64", "chunked vs rec", "HF torch fp32", "chunked/HF",
            "HF err", "layer", "layer matmuls", "layer/mm", "load"]
    lines = [
        f"float64 reference, {result['config']}; numpy {result['numpy']} (madvise hugepage: "
        f"{result.get('numpy_madvise_hugepage')}), torch {result['torch']}, "
        f"transformers {result['transformers']}, {result['cpus']} CPUs; median of {result['repeat']} "
        "(recurrent: 1 run); time / peak memory growth",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    for r in result["rows"]:
        cells = [str(r["T"]), str(r["threads"]), _fmt(r.get("recurrent")), _fmt(r.get("chunked")),
                 _err(r, "chunked_vs_recurrent"), _fmt(r.get("hf_torch_chunk_fp32")),
                 _ratio(r, "chunked", "hf_torch_chunk_fp32"), _err(r, "hf_vs_chunked"), _fmt(r.get("layer")),
                 _fmt(r.get("layer_matmuls")), _ratio(r, "layer", "layer_matmuls"), _load_text(r)]
        lines.append("| " + " | ".join(cells) + " |")
    blas = sorted({b for r in result["rows"] for b in r.get("env", {}).get("blas", [])})
    lines.append(f"BLAS as measured: {'; '.join(blas) or 'unknown'}")
    return "\n".join(lines)


# --- command line -----------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="?", default="reference", choices=["reference", "moe"],
                   help="what to benchmark: the reference layer and delta rule, or the MoE block (moe)")
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


def run_from_args(args: argparse.Namespace) -> int:
    from .env import blas_threads

    tokens_default, repeat_default = ("16,40", 1) if args.quick else ("1024,4096,16384", 3)
    if args.target == "moe" and not args.quick:
        tokens_default = "4096"
    tokens = [int(t) for t in str(args.tokens or tokens_default).split(",") if t.strip()]
    threads = [int(t) for t in str(args.threads).split(",") if t.strip()] if args.threads else [blas_threads()]
    if args.target == "moe":
        from .bench_moe import MOE_QUICK, MOE_REAL, bench_moe, moe_table

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
    p = argparse.ArgumentParser(prog="python -m gdncheck.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run_from_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
