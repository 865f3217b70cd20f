"""Benchmark of the float64 mixture-of-experts block: ``gdncheck bench moe`` (``python -m gdncheck.bench moe``).

At the real sizes of Qwen3-Next / Qwen3.5-MoE (E = 512 experts, 10 active, D = 2048,
moe_intermediate_size = shared_expert_intermediate_size = 512) and T tokens of one sequence, it
measures :func:`gdncheck.reference.mlp_moe` against its GEMMs alone: the router GEMM, each expert's
three products on its own tokens (the inputs already gathered, contiguous), the shared expert's
three products and its gate's; operands of the same shapes, made outside what is timed. The ratio
is what the block spends beyond its matrix products (softmax and top-k, grouping, gathers, SwiGLU,
weighting, scatter-adds).

Memory: 512 experts × 3 × 2048 × 512 float64 weights are 12.9 GB. ``--experts-in-memory P`` holds P
distinct weight sets and gives expert e the set e mod P (every expert still runs its own GEMMs on
its own tokens; with P ≥ 16 the sets far exceed the caches, so the timing is that of E distinct
experts). The default holds all E when the machine has room for them (MemAvailable ≥ 1.5 × their
size), else 64. Both measures see the same weights.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from .common import load_average, measure, thread_info


@dataclass(frozen=True)
class MoEDims:
    E: int
    top_k: int
    D: int
    I_moe: int
    I_shared: int

    def summary(self) -> str:
        return f"E={self.E} top_k={self.top_k} D={self.D} I_moe={self.I_moe} I_shared={self.I_shared}"

    def expert_bytes(self) -> int:
        return self.E * 3 * self.D * self.I_moe * 8


MOE_REAL = MoEDims(E=512, top_k=10, D=2048, I_moe=512, I_shared=512)
MOE_QUICK = MoEDims(E=16, top_k=4, D=32, I_moe=16, I_shared=24)


class PooledExperts:
    """Stacked expert weights [E, ...] holding P distinct sets: expert e reads set e mod P.

    Offers what :func:`gdncheck.reference.experts` reads of its weights: ``shape`` and ``[e]``.
    """

    def __init__(self, pool: np.ndarray, num_experts: int):
        self.pool = pool
        self.shape = (num_experts, *pool.shape[1:])

    def __getitem__(self, e):
        return self.pool[int(e) % self.pool.shape[0]]


def mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def default_pool(dims: MoEDims) -> int:
    avail = mem_available()
    return dims.E if avail is not None and avail >= 1.5 * dims.expert_bytes() else min(dims.E, 64)


def moe_weights(dims: MoEDims, pool: int, seed: int = 0) -> dict:
    """float64 weights like transformers' initialisation (normal, std 0.02); experts in ``pool`` sets."""
    rng = np.random.default_rng(seed)
    E, D, Im, Is = dims.E, dims.D, dims.I_moe, dims.I_shared

    def normal(*shape):
        return rng.normal(0.0, 0.02, size=shape)

    def experts(*shape):
        arr = normal(pool, *shape)
        return arr if pool == E else PooledExperts(arr, E)

    return {"w_router": normal(E, D), "w_gate": experts(Im, D), "w_up": experts(Im, D), "w_down": experts(D, Im),
            "w_shared_gate": normal(Is, D), "w_shared_up": normal(Is, D), "w_shared_down": normal(D, Is),
            "w_shared_expert_gate": normal(1, D)}


ARGS = ("w_router", "w_gate", "w_up", "w_down", "w_shared_gate", "w_shared_up", "w_shared_down",
        "w_shared_expert_gate")


def moe_gemms(h: np.ndarray, selected: np.ndarray, w: dict):
    """A function doing every matrix product of ``mlp_moe(h)`` alone; operands made here, untimed."""
    x = h.reshape(-1, h.shape[-1])
    E, Im = w["w_gate"].shape[0], w["w_gate"].shape[1]
    counts = np.bincount(selected.reshape(-1), minlength=E)
    groups = [(e, np.ascontiguousarray(x[np.flatnonzero((selected.reshape(x.shape[0], -1) == e).any(-1))]),
               np.empty((counts[e], Im))) for e in np.flatnonzero(counts)]
    shared_act = np.empty((x.shape[0], w["w_shared_gate"].shape[0]))

    def run():
        x @ w["w_router"].T
        for e, xe, act in groups:
            np.matmul(xe, w["w_gate"][e].T, out=act)
            xe @ w["w_up"][e].T
            act @ w["w_down"][e].T
        np.matmul(x, w["w_shared_gate"].T, out=shared_act)
        x @ w["w_shared_up"].T
        shared_act @ w["w_shared_down"].T
        x @ w["w_shared_expert_gate"].T

    return run


def bench_moe(tokens: list[int], repeat: int, threads: list[int], dims: MoEDims = MOE_REAL,
              pool: int | None = None) -> dict:
    """One row per (thread count, T): the block and its GEMMs (median wall and CPU seconds, peak memory
    growth), their ratio, and how the tokens spread over the experts."""
    from threadpoolctl import threadpool_limits

    from ..reference import mlp_moe, routing

    pool = pool or default_pool(dims)
    w = moe_weights(dims, pool)
    rows = []
    for n_threads in threads:
        limiter = threadpool_limits(limits=n_threads, user_api="blas")
        for T in tokens:
            row: dict = {"T": T, "threads": n_threads, "load_before": load_average()}
            h = np.random.default_rng(1).normal(size=(1, T, dims.D))
            _, selected = routing(h @ w["w_router"].T, dims.top_k)
            counts = np.bincount(selected.reshape(-1), minlength=dims.E)
            row.update(experts_hit=int((counts > 0).sum()), max_tokens_per_expert=int(counts.max()))
            block = partial(mlp_moe, h, *(w[a] for a in ARGS), dims.top_k)
            figures, _ = measure({"block": block, "gemms": moe_gemms(h, selected, w)}, repeat, keep=False)
            row.update(figures)
            row["ratio"] = figures["block"]["seconds"] / figures["gemms"]["seconds"]
            row["cpu_ratio"] = figures["block"]["cpu_seconds"] / figures["gemms"]["cpu_seconds"]
            row["load_after"] = load_average()
            row["env"] = thread_info()
            rows.append(row)
            print(f"T={T} threads={n_threads} block {figures['block']['seconds']:.3f} s  gemms "
                  f"{figures['gemms']['seconds']:.3f} s  ratio {row['ratio']:.3f}", file=sys.stderr, flush=True)
        limiter.restore_original_limits()
    return {"config": dims.summary(), "experts_in_memory": pool, "repeat": repeat, "threads": threads,
            "numpy": np.__version__, "cpus": thread_info()["cpus"], "rows": rows}


def moe_table(result: dict) -> str:
    head = ["T", "threads", "block", "GEMMs alone", "block/GEMMs", "experts hit", "max tokens/expert", "load"]
    lines = [
        f"float64 MoE block (reference/moe.py), {result['config']}, {result['experts_in_memory']} distinct expert "
        f"weight sets in memory; numpy {result['numpy']}, {result['cpus']} CPUs; median of {result['repeat']}; "
        "time / peak memory growth",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    for r in result["rows"]:
        def fmt(m):
            return f"{m['seconds']:.3f} s / {m['peak_mib']:.0f} MiB" if m.get("peak_mib") is not None else \
                f"{m['seconds']:.3f} s"
        load = f"{r['load_before'][0]:.1f}→{r['load_after'][0]:.1f}" if r.get("load_before") else "-"
        lines.append("| " + " | ".join([
            str(r["T"]), str(r["threads"]), fmt(r["block"]), fmt(r["gemms"]),
            f"{r['ratio']:.2f}x (cpu {r['cpu_ratio']:.2f}x)", str(r["experts_hit"]), str(r["max_tokens_per_expert"]),
            load]) + " |")
    blas = sorted({b for r in result["rows"] for b in r.get("env", {}).get("blas", [])})
    lines.append(f"BLAS as measured: {'; '.join(blas) or 'unknown'}")
    return "\n".join(lines)
