"""The serving benchmark of the float64 reference: ``python -m gdncheck.bench serving``.

One packed call of N sequences (default 8, of 1 to 2048 tokens, in permuted pool slots) through
``reference.serving.forward_packed``, against the equivalent separate calls: ``Layer.forward`` once per
sequence on a one-row state. Both start from zero states and keep every output and stage trace until
the end of the run (the packed call returns them all at once), at real head sizes (Hk=16, Hv=32,
dk=dv=128, D=2048, I=6144). Timing as in :mod:`gdncheck.bench`: the median of ``--repeat`` runs taken
in turns, CPU seconds, peak memory growth and the load average; a first, untimed pair of runs gives
the normwise difference between the two (outputs and final states).
"""

from __future__ import annotations

import os
import platform
import sys

import numpy as np

from ..config import REAL, GDNConfig
from .common import QUICK, fmt_measure, load_average, measure, normwise, set_numpy_hugepage, thread_info

#: 8 sequences of 1 to 2048 tokens: decodes, chunk edges (63/64/65 are in the tests), prefills.
LENGTHS = (1, 17, 64, 65, 256, 700, 1500, 2048)
QUICK_LENGTHS = (1, 5, 16, 17, 40)
#: The pool is larger than the call and its slots are used out of order, as an engine's are.
POOL_EXTRA = 3


def bench_serving(lengths: list[int], repeat: int, threads: list[int], cfg: GDNConfig = REAL,
                  numpy_hugepage: bool | None = None) -> dict:
    """Packed against separate calls, one row per thread count."""
    from threadpoolctl import threadpool_limits

    from ..reference import Layer, StatePool, forward_packed
    from ..synthetic import make_inputs, make_weights

    previous = set_numpy_hugepage(numpy_hugepage)
    try:
        layer = Layer(cfg, make_weights(cfg, seed=0))
        xs = [make_inputs(cfg, 1, n, seed=1 + i)[0] for i, n in enumerate(lengths)]
        x = np.concatenate(xs)
        cu = np.concatenate([[0], np.cumsum(lengths)])
        size = len(lengths) + POOL_EXTRA
        slots = np.random.default_rng(0).permutation(size)[: len(lengths)]

        def packed():
            pool = StatePool(cfg, size)
            out, trace = forward_packed(layer, pool, x, cu, 0, slots)
            return out, trace, pool

        def separate():
            results = []
            for x_i in xs:
                state = layer.new_state(1)
                out, trace = layer.forward(x_i[None], state, 0)
                results.append((out, trace, state))
            return results

        rows = []
        for n_threads in threads:
            limiter = threadpool_limits(limits=n_threads, user_api="blas")
            row: dict = {"threads": n_threads, "load_before": load_average()}
            (p_out, _, pool), sep = packed(), separate()
            row["packed_vs_separate"] = max(
                max(normwise(p_out[cu[i]:cu[i + 1]], o[0]) for i, (o, _, _) in enumerate(sep)),
                max(normwise(pool.recurrent_state[s], st.recurrent_state[0]) for s, (_, _, st) in zip(slots, sep)),
                max(normwise(pool.conv_state[s], st.conv_state[0]) for s, (_, _, st) in zip(slots, sep)),
            )
            del p_out, pool, sep
            figures, _ = measure({"packed": packed, "separate": separate}, repeat, keep=False)
            row.update(figures)
            row["load_after"] = load_average()
            row["env"] = thread_info()
            rows.append(row)
            print(_row_text(row), file=sys.stderr, flush=True)
            limiter.restore_original_limits()
    finally:
        set_numpy_hugepage(previous)
    return {
        "config": cfg.summary(),
        "lengths": list(lengths),
        "total_tokens": int(sum(lengths)),
        "pool_size": len(lengths) + POOL_EXTRA,
        "repeat": repeat,
        "threads": threads,
        "numpy": np.__version__,
        "numpy_madvise_hugepage": set_numpy_hugepage(None),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "rows": rows,
    }


def _ratio(row: dict) -> str:
    p, s = row["packed"], row["separate"]
    return f"{p['seconds'] / s['seconds']:.2f}x (cpu {p['cpu_seconds'] / s['cpu_seconds']:.2f}x)"


def _row_text(row: dict) -> str:
    return (f"threads={row['threads']}  packed: {fmt_measure(row['packed'])}  "
            f"separate: {fmt_measure(row['separate'])}  packed/separate: {_ratio(row)}")


def table(result: dict) -> str:
    head = ["threads", "packed", "separate", "packed/separate", "packed vs separate", "load"]
    lines = [
        f"float64 reference, {result['config']}; {len(result['lengths'])} sequences of {result['lengths']} tokens "
        f"({result['total_tokens']} in all) in a pool of {result['pool_size']} slots; numpy {result['numpy']}, "
        f"{result['cpus']} CPUs; median of {result['repeat']}; time / peak memory growth",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    for r in result["rows"]:
        before, after = r.get("load_before"), r.get("load_after")
        load = f"{before[0]:.1f}→{after[0]:.1f}" if before and after else "-"
        cells = [str(r["threads"]), fmt_measure(r["packed"]), fmt_measure(r["separate"]), _ratio(r),
                 f"{r['packed_vs_separate']:.1e}", load]
        lines.append("| " + " | ".join(cells) + " |")
    blas = sorted({b for r in result["rows"] for b in r.get("env", {}).get("blas", [])})
    lines.append(f"BLAS as measured: {'; '.join(blas) or 'unknown'}")
    return "\n".join(lines)


def run(args, threads: list[int]) -> dict:
    """The serving benchmark from the parsed arguments of ``python -m gdncheck.bench``."""
    lengths = args.lengths or list(QUICK_LENGTHS if args.quick else LENGTHS)
    return bench_serving(lengths, args.repeat or (1 if args.quick else 3), threads,
                         cfg=QUICK if args.quick else REAL, numpy_hugepage=args.numpy_hugepage == "on")
