"""``python -m gdncheck.bench reference``: the float64 reference's delta rule and layer against their
matmuls and transformers' fp32 chunked rule (the figures of :mod:`gdncheck.bench`)."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from functools import partial

import numpy as np

from ..config import REAL, GDNConfig
from .common import (
    fmt_measure,
    load_average,
    measure,
    normwise,
    package_version,
    set_numpy_hugepage,
    thread_info,
)

CHUNK = 64


MEASURES = ("recurrent", "chunked", "hf_torch_chunk_fp32", "layer", "layer_matmuls")


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
    """transformers' ``torch_chunk_gated_delta_rule`` or None when transformers is not installed: its own
    PyTorch function, which the decorator keeps as ``__wrapped__`` (with fla installed, the module name is
    bound to fla's Triton kernel, which needs a GPU driver)."""
    try:
        from transformers.models.qwen3_5 import modeling_qwen3_5 as m
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None
    fn = getattr(m, "torch_chunk_gated_delta_rule", None)
    return getattr(fn, "__wrapped__", fn)


def layer_matmuls(layer, x: np.ndarray, chunk_size: int = CHUNK) -> Callable[[], object]:
    """A function doing every matrix product of ``layer.forward(x)`` alone, on float64 operands of the
    same shapes: the projections (in_proj ×4, out_proj, mlp ×3) and the products of the chunked delta
    rule (:func:`_delta_rule_matmuls`). Operands are made here, outside what is timed."""
    from ..reference.delta_rule_chunked import BLOCK_TOKENS

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


def bench_reference(tokens: list[int], repeat: int, recurrent_max: int, layer_max: int,
                    threads: list[int], cfg: GDNConfig = REAL, use_hf: bool = True,
                    numpy_hugepage: bool | None = None) -> dict:
    """The figures of the module docstring, one row per (thread count, T). ``numpy_hugepage``: set numpy's
    madvise-hugepage switch for the run (None: leave it), restored afterwards."""
    previous = set_numpy_hugepage(numpy_hugepage)
    try:
        return _bench_reference(tokens, repeat, recurrent_max, layer_max, threads, cfg, use_hf)
    finally:
        set_numpy_hugepage(previous)


def _bench_reference(tokens: list[int], repeat: int, recurrent_max: int, layer_max: int,
                     threads: list[int], cfg: GDNConfig, use_hf: bool) -> dict:
    from threadpoolctl import threadpool_limits

    from ..reference import Layer, delta_rule_chunked, delta_rule_recurrent
    from ..synthetic import make_inputs, make_weights

    hf = hf_chunk_rule() if use_hf else None
    layer = Layer(cfg, make_weights(cfg, seed=0)) if layer_max else None
    rows = []
    for n_threads in threads:
        limiter = threadpool_limits(limits=n_threads, user_api="blas")
        if hf is not None:
            import torch

            torch.set_num_threads(n_threads)
        for T in tokens:
            row: dict = {"T": T, "threads": n_threads, "load_before": load_average()}
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
            row["load_after"] = load_average()
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
        "numpy_madvise_hugepage": set_numpy_hugepage(None),
        "torch": package_version("torch") if hf is not None else None,
        "transformers": package_version("transformers") if hf is not None else None,
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
    parts += [f"{key}: {fmt_measure(row[key])}" for key in MEASURES if key in row]
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
        cells = [str(r["T"]), str(r["threads"]), fmt_measure(r.get("recurrent")), fmt_measure(r.get("chunked")),
                 _err(r, "chunked_vs_recurrent"), fmt_measure(r.get("hf_torch_chunk_fp32")),
                 _ratio(r, "chunked", "hf_torch_chunk_fp32"), _err(r, "hf_vs_chunked"), fmt_measure(r.get("layer")),
                 fmt_measure(r.get("layer_matmuls")), _ratio(r, "layer", "layer_matmuls"), _load_text(r)]
        lines.append("| " + " | ".join(cells) + " |")
    blas = sorted({b for r in result["rows"] for b in r.get("env", {}).get("blas", [])})
    lines.append(f"BLAS as measured: {'; '.join(blas) or 'unknown'}")
    return "\n".join(lines)
