"""Benchmark of the Triton path against the machine's own ceilings, measured in the same run.

    python -m gdncheck.gpu_tools.bench              # on a CUDA GPU (scripts/gpu_check.sh runs it)
    python -m gdncheck.gpu_tools.bench --dry-run    # same code path, CPU interpreter, tiny sizes

Ceilings (a device copy, a tf32 and a bf16 GEMM), then the decode kernel, a whole-layer decode
step (plain and from a CUDA graph), the chunked prefill against its FLOP floors, flash-linear-
attention on the same inputs when it imports, and the serving patterns. GPU times are
`triton.testing.do_bench` medians; CPU times wall-clock medians.

The rows, the floors F_design and F(C), and the goals: docs/gpu.md §7.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from functools import partial

import torch

from gdncheck.config import REAL, GDNConfig
from gdncheck.gpu_impl.delta_rule import delta_rule_recurrent, delta_rule_recurrent_packed
from gdncheck.gpu_impl.delta_rule_chunked import delta_rule_chunked, delta_rule_chunked_packed
from gdncheck.gpu_impl.packed import host_layout
from gdncheck.gpu_impl.target import resolve_device
from gdncheck.untrusted import OneLineParser


@dataclass(frozen=True)
class Sizes:
    Hk: int
    Hv_decode: tuple[int, ...]
    Hv_prefill: int
    dk: int
    batches: tuple[int, ...]
    layer_batches: tuple[int, ...]
    tokens: tuple[int, ...]
    chunk: int
    copy_bytes: int
    gemm: int
    layer: GDNConfig


GPU = Sizes(Hk=16, Hv_decode=(32, 48, 64), Hv_prefill=32, dk=128, batches=(1, 64, 256), layer_batches=(1, 64),
            tokens=(8192, 32768), chunk=64, copy_bytes=1 << 30, gemm=8192,
            layer=REAL)
DRY = Sizes(Hk=2, Hv_decode=(4,), Hv_prefill=4, dk=16, batches=(1, 2), layer_batches=(1,), tokens=(64,), chunk=16,
            copy_bytes=1 << 22, gemm=128,
            layer=GDNConfig(hidden_size=32, intermediate_size=48, num_k_heads=2, num_v_heads=4, head_k_dim=16,
                            head_v_dim=8, conv_kernel=4))


@dataclass(frozen=True)
class ServingSizes:
    """The serving rows (gpu_impl/serving.py): a packed prefill of sequences of ``lengths``, and decode
    of ``batch`` sequences on slots drawn at random among the ``pool`` slots of a pool."""

    lengths: tuple[int, ...]
    batch: int
    pool: int


#: 8 mixed lengths, 8192 tokens: the T of the prefill rows (and the compile plan's packed prefill)
SERVING_GPU = ServingSizes(lengths=(2048, 1536, 1200, 1024, 900, 800, 600, 84), batch=64, pool=256)
SERVING_DRY = ServingSizes(lengths=(17, 5, 1, 1), batch=2, pool=4)


def flops_per_token_head(C: int, dk: int, dv: int) -> float:
    """F(C): the minimal FLOPs of the chunked form per token and value head (triangular inverse)."""
    return 6 * dk * dv + 6 * C * dk + 4 * C * dv + C * C / 3


def design_flops_per_token_head(C: int, dk: int, dv: int) -> float:
    """F_design(C): the FLOPs this pipeline performs per token and value head. Per chunk: K Kᵀ,
    Q Kᵀ and W (2·C²·dk each), U (2·C²·dv), the inverse's log2(C) − 1 levels of two full C³
    products (4·C³ each), then W S, Q S, Kᵀ V' (2·C·dk·dv each) and (Q Kᵀ) V' (2·C²·dv)."""
    return 6 * dk * dv + 6 * C * dk + 4 * C * dv + 4 * (int(math.log2(C)) - 1) * C * C


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
    """((fused_recurrent, chunk) of flash-linear-attention, None) or (None, why it is unavailable)."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available"; say which
        return None, f"not importable ({type(exc).__name__}: {exc})"[:160]
    return (fused_recurrent_gated_delta_rule, chunk_gated_delta_rule), None


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
    out = {"copy_GBps": 2 * s.copy_bytes / t_copy / 1e9}
    for name, dtype in (("tf32", torch.float32), ("bf16", torch.bfloat16 if device.type == "cuda" else torch.float32)):
        a = torch.randn(s.gemm, s.gemm, device=device, dtype=dtype)
        b = torch.randn(s.gemm, s.gemm, device=device, dtype=dtype)
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            out[f"{name}_TFLOPs"] = 2 * s.gemm ** 3 / measure(partial(torch.matmul, a, b)) / 1e12
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
    return out


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


def bench_layer_decode(s: Sizes, device, measure) -> list[dict]:
    """One decode step of the whole layer (bf16), plainly and replayed from a CUDA graph."""
    from gdncheck.gpu_impl.layer import Layer
    from gdncheck.synthetic import make_weights

    profile = "bf16" if device.type == "cuda" else "f32"
    layer = Layer(s.layer, make_weights(s.layer, seed=0), profile=profile, device=device)
    rows = []
    for B in s.layer_batches:
        state = layer.new_state(B)
        x = torch.randn(B, 1, s.layer.hidden_size, device=device).to(layer.dtype)
        step = partial(layer.forward, x, state, state.seq_len)  # seq_pos = the state's own seq_len
        row = {"B": B, "profile": profile, "plain_us": measure(step) * 1e6}
        if device.type == "cuda":
            row["graph_us"] = measure(_captured(step).replay) * 1e6
        else:
            row["graph"] = "CUDA graphs need a GPU"
        rows.append(row)
    return rows


def _captured(step):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile and allocate outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def bench_prefill(s: Sizes, device, measure, ceil: dict) -> list[dict]:
    rows = []
    F_design = design_flops_per_token_head(s.chunk, s.dk, s.dk)
    F_min = flops_per_token_head(s.chunk, s.dk, s.dk)
    rate = ceil["tf32_TFLOPs"] * 1e12
    for T in s.tokens:
        q, k, v, g, beta = delta_inputs(1, T, s.Hk, s.Hv_prefill, s.dk, device)
        t = measure(partial(delta_rule_chunked, q, k, v, g, beta, None, None, s.chunk))
        flop = F_design * T * s.Hv_prefill
        floor, floor_min = flop / rate, F_min * T * s.Hv_prefill / rate
        rows.append({"T": T, "Hv": s.Hv_prefill, "ms": t * 1e3, "Mtok_s": T / t / 1e6, "TFLOPs": flop / t / 1e12,
                     "floor_ms": floor * 1e3, "x_floor": t / floor, "floor_min_ms": floor_min * 1e3,
                     "x_floor_min": t / floor_min})
    return rows


def bench_serving(s: Sizes, sv: ServingSizes, device, measure) -> list[dict]:
    """The serving patterns against their plain counterparts (issue 14's goals: a packed prefill of
    mixed lengths within 1.2x of one prefill of the same total length; decode with slot indices at
    B = 64 within 1.1x of contiguous states), for the delta rule alone and for the whole layer.

    Packed prefill: the chunked form over the packed stream (states in pool slots, in place) against
    ``delta_rule_chunked`` at B = 1, T = the total; the layer's ``forward_packed`` (host layout: checked
    and copied each call) against ``Layer.forward`` on [1, T]. Decode: the fused recurrent kernel
    reading and writing B permuted slots of a larger pool against contiguous [B] states; the layer
    step from a layout on the device (positions gathered from the pool's seq_len, as an engine keeps
    them) against ``Layer.forward`` with the state's own seq_len, plainly and replayed from a CUDA graph."""
    from gdncheck.gpu_impl.layer import Layer
    from gdncheck.gpu_impl.serving import StatePool, forward_packed
    from gdncheck.synthetic import make_weights

    rows = []
    lengths, N, total = sv.lengths, len(sv.lengths), sum(sv.lengths)
    q, k, v, g, beta = delta_inputs(1, total, s.Hk, s.Hv_prefill, s.dk, device)
    pool = torch.zeros(N, s.Hv_prefill, s.dk, s.dk, device=device)
    layout = host_layout(lengths, list(range(N)), device, s.chunk)
    t_packed = measure(partial(delta_rule_chunked_packed, q, k, v, g, beta, pool, None, layout))
    t_one = measure(partial(delta_rule_chunked, q, k, v, g, beta, None, None, s.chunk))
    shape = f"{N} seqs ({'+'.join(map(str, lengths))}) vs T={total}, Hv={s.Hv_prefill}"
    rows.append({"pattern": "packed prefill", "what": "delta rule", "shape": shape, "us": t_packed * 1e6,
                 "baseline_us": t_one * 1e6, "goal": 1.2})
    profile = "bf16" if device.type == "cuda" else "f32"
    layer = Layer(s.layer, make_weights(s.layer, seed=0), profile=profile, device=device, chunk_size=s.chunk)
    x = torch.randn(total, s.layer.hidden_size, device=device).to(layer.dtype)
    cu = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    layer_pool, state = StatePool.for_layer(layer, N), layer.new_state(1)
    t_packed = measure(partial(forward_packed, layer, layer_pool, x, cu, 0, list(range(N))))
    t_one = measure(partial(layer.forward, x[None], state, 0))
    rows.append({"pattern": "packed prefill", "what": f"layer ({profile})", "shape": f"{N} seqs vs T={total}",
                 "us": t_packed * 1e6, "baseline_us": t_one * 1e6, "goal": 1.2})

    B, Hv = sv.batch, s.Hv_prefill
    gen = torch.Generator().manual_seed(0)
    slots = torch.randperm(sv.pool, generator=gen)[:B]
    q, k, v, g, beta, S = decode_inputs(s, Hv, B, device)
    pool = torch.randn(sv.pool, Hv, s.dk, s.dk, generator=gen).to(device) * 0.1
    layout = host_layout([1] * B, slots.tolist(), device)
    flat = [t.reshape(1, B, *t.shape[2:]) for t in (q, k, v, g, beta)]  # the batch as one stream of B tokens
    t_slots = measure(partial(delta_rule_recurrent_packed, *flat, pool, None, layout))
    t_contig = measure(partial(delta_rule_recurrent, q, k, v, g, beta, S, None, out_state=S))
    rows.append({"pattern": "decode with slots", "what": "delta rule", "shape": f"B={B} of {sv.pool} slots, Hv={Hv}",
                 "us": t_slots * 1e6, "baseline_us": t_contig * 1e6, "goal": 1.1})
    layer_pool, state = StatePool.for_layer(layer, sv.pool), layer.new_state(B)
    x = torch.randn(B, 1, s.layer.hidden_size, device=device).to(layer.dtype)
    d_slots, d_cu = slots.to(device), torch.arange(B + 1, device=device)
    d_pos = torch.empty(B, dtype=torch.int64, device=device)

    def packed_step():
        torch.index_select(layer_pool.seq_len, 0, d_slots, out=d_pos)
        return forward_packed(layer, layer_pool, x.view(B, -1), d_cu, d_pos, d_slots)

    plain_step = partial(layer.forward, x, state, state.seq_len)
    row = {"pattern": "decode with slots", "what": f"layer ({profile})", "shape": f"B={B} of {sv.pool} slots",
           "us": measure(packed_step) * 1e6, "baseline_us": measure(plain_step) * 1e6, "goal": 1.1}
    rows.append(row)
    if device.type == "cuda":
        rows.append({**row, "what": f"layer ({profile}), CUDA graph",
                     "us": measure(_captured(packed_step).replay) * 1e6,
                     "baseline_us": measure(_captured(plain_step).replay) * 1e6})
    for row in rows:
        row["ratio"] = row["us"] / row["baseline_us"]
    return rows


def fla_heads(q: torch.Tensor, k: torch.Tensor, Hv: int):
    """q, k [B, T, Hk, d] repeated to Hv heads, value head h reading key head h // (Hv/Hk)."""
    r = Hv // q.shape[2]
    return q.repeat_interleave(r, dim=2).contiguous(), k.repeat_interleave(r, dim=2).contiguous()


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


def _fla_decode(fused_recurrent, q, k, v, g, beta, S, measure, t_ours) -> dict:
    try:
        qh, kh = fla_heads(q, k, v.shape[2])
        h0 = S.clone()
        t = measure(partial(fused_recurrent, q=qh, k=kh, v=v, g=g, beta=beta, initial_state=h0,
                            output_final_state=True))
        ours, _ = delta_rule_recurrent(q, k, v, g, beta, S.clone())
        theirs, _ = fused_recurrent(q=qh, k=kh, v=v, g=g, beta=beta, initial_state=S.clone(), output_final_state=True)
        return {"fla_over_ours": t / t_ours, "fla_rel_diff": rel_diff(ours, theirs)}
    except Exception as exc:  # noqa: BLE001 - report, do not abort the table
        return {"fla_error": f"{type(exc).__name__}: {exc}"[:120]}


def _fla_prefill(chunk_rule, q, k, v, g, beta, C, measure, t_ours) -> dict:
    try:
        qh, kh = fla_heads(q, k, v.shape[2])
        t = measure(partial(chunk_rule, q=qh, k=kh, v=v, g=g, beta=beta, output_final_state=True))
        ours, _ = delta_rule_chunked(q, k, v, g, beta, None, None, C)
        theirs, _ = chunk_rule(q=qh, k=kh, v=v, g=g, beta=beta, output_final_state=True)
        return {"fla_over_ours": t / t_ours, "fla_rel_diff": rel_diff(ours, theirs)}
    except Exception as exc:  # noqa: BLE001 - report, do not abort the table
        return {"fla_error": f"{type(exc).__name__}: {exc}"[:120]}


def _fla_cells(row: dict, fla: str) -> list[str]:
    if "fla_over_ours" in row:
        return [f"{row['fla_over_ours']:.2f}x", f"{row['fla_rel_diff']:.1e}"]
    if "fla_error" in row:
        return [f"error: {row['fla_error']}", ""]
    return [fla, ""]


def markdown(result: dict) -> str:
    """The benchmark as Markdown tables (also what the console shows)."""
    c = result["ceilings"]
    fla = result["fla"]
    lines = [
        f"**gdncheck.gpu_tools.bench** on {result['device_name']} ({result['mode']}); torch {result['torch']}, "
        f"triton {result['triton']}; flash-linear-attention: {fla}",
        "",
        f"Ceilings measured now: copy {c['copy_GBps']:.0f} GB/s (read + write), tf32 GEMM "
        f"{c['tf32_TFLOPs']:.1f} TFLOP/s, bf16 GEMM {c['bf16_TFLOPs']:.1f} TFLOP/s"
        + (" (on the CPU both are fp32 GEMMs)." if result["device_name"].startswith("cpu") else "."),
        "",
        "Decode kernel (fused recurrent, T = 1, fp32 state in place, bf16 q/k/v; FLA given q, k repeated to Hv):",
        "",
        "| Hv | B | µs | GB/s | % copy | FLA / ours | rel diff |",
        "|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in result["decode"]:
        lines.append(f"| {r['Hv']} | {r['B']} | {r['us']:.2f} | {r['GBps']:.1f} | {r['pct_copy']:.1f} | "
                     + " | ".join(_fla_cells(r, fla)) + " |")
    lines += ["", "Decode step of the whole layer (plain: `Layer.forward` with its host launches; graph: "
              "the same step replayed from a CUDA graph):", "",
              "| B | profile | plain µs | graph µs |", "|---:|---|---:|---:|"]
    for r in result["layer_decode"]:
        graph = f"{r['graph_us']:.1f}" if "graph_us" in r else r.get("graph", "")
        lines.append(f"| {r['B']} | {r['profile']} | {r['plain_us']:.1f} | {graph} |")
    p = result["prefill_flops"]
    lines += ["", f"Prefill (chunked WY pipeline, B = 1, C = {result['chunk']}, bf16 inputs, every dot tf32). "
              f"Floor = FLOPs / tf32 GEMM rate; FLOPs by F_design = {p['design']:,.0f} per token and value head "
              f"(what these kernels compute), floor_min by F(C) = {p['minimal']:,.0f} (the minimal count):", "",
              "| T | Hv | ms | Mtok/s | TFLOP/s | floor ms | × floor | × floor_min | FLA / ours | rel diff |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in result["prefill"]:
        lines.append(f"| {r['T']} | {r['Hv']} | {r['ms']:.3f} | {r['Mtok_s']:.2f} | {r['TFLOPs']:.1f} | "
                     f"{r['floor_ms']:.4f} | {r['x_floor']:.1f} | {r['x_floor_min']:.1f} | "
                     + " | ".join(_fla_cells(r, fla)) + " |")
    if result.get("serving"):
        lines += ["", "Serving patterns (gpu_impl/serving.py) against their plain counterparts: a packed prefill "
                  "of mixed lengths against one prefill of the same total length, decode with slot indices "
                  "against contiguous states (ratio = ours / baseline; goal: at most):", "",
                  "| pattern | what | shape | µs | baseline µs | ratio | goal |", "|---|---|---|---:|---:|---:|---:|"]
        for r in result["serving"]:
            lines.append(f"| {r['pattern']} | {r['what']} | {r['shape']} | {r['us']:.1f} | {r['baseline_us']:.1f} | "
                         f"{r['ratio']:.2f} | {r['goal']:.1f} |")
    return "\n".join(lines)


def run(dry_run: bool = False, json_path: str | None = None, markdown_path: str | None = None) -> dict:
    dev = resolve_device("cpu" if dry_run else None)
    if dev.type != "cuda" and not dry_run:
        raise SystemExit("gdncheck.gpu_tools.bench: no CUDA device; use --dry-run for the CPU interpreter")
    s = DRY if dry_run else GPU
    measure = timer(dev, repeat=3)
    if dev.type == "cuda":
        fla, why = fla_ops()
    else:
        fla, why = None, "not run on the CPU (dry run)"
    import triton

    ceil = ceilings(s, dev, measure)
    result = {
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (Triton interpreter)",
        "mode": "dry run, tiny sizes" if dry_run else "full sizes",
        "torch": torch.__version__, "triton": triton.__version__,
        "fla": "imported" if fla else why,
        "chunk": s.chunk, "ceilings": ceil,
        "prefill_flops": {"design": design_flops_per_token_head(s.chunk, s.dk, s.dk),
                          "minimal": flops_per_token_head(s.chunk, s.dk, s.dk), "dot_precision": "tf32"},
        "decode": bench_decode(s, dev, measure, ceil),
        "layer_decode": bench_layer_decode(s, dev, measure),
        "prefill": bench_prefill(s, dev, measure, ceil),
        # on the CPU, one timed run per case: the interpreter's times say nothing of a GPU's
        "serving": bench_serving(s, SERVING_DRY if dry_run else SERVING_GPU, dev,
                                 measure if dev.type == "cuda" else timer(dev, repeat=1)),
    }
    _emit(result, json_path, markdown_path)
    if fla is not None:
        print("\nflash-linear-attention on the same inputs (its first calls autotune) ...", flush=True)
        bench_fla(s, dev, measure, result, fla)
        _emit(result, json_path, markdown_path)
    return result


def _emit(result: dict, json_path: str | None, markdown_path: str | None) -> None:
    text = markdown(result)
    print(text, flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
    if markdown_path:
        with open(markdown_path, "w") as f:
            f.write(text + "\n")


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m gdncheck.gpu_tools.bench", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny sizes (checks the code path)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--markdown", metavar="PATH", help="also write the tables as Markdown")
    args = p.parse_args(argv)
    from gdncheck.writes import refuse_write_into_suite

    for path, flag in ((args.json, "--json"), (args.markdown, "--markdown")):
        if path:  # refused before the kernels are timed
            refuse_write_into_suite(path, flag)
    run(dry_run=args.dry_run, json_path=args.json, markdown_path=args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
