"""The device memory of one layer call: what is alive at once, and the largest B·T that fits.

    python -m gdncheck.gpu_impl.memory [--memory-gb 141] [--batch 64]

The model follows `Layer._run` without `capture`: each activation is released once the next
stage has read it, so the live set changes phase by phase (bytes per token, `e` the profile's bytes
per element). The chunked prefill's fp32 temporaries are bounded by slicing rows to
`delta_rule_chunked.TEMP_BUDGET`; `packed_peak` and `verify_steps_bytes` model the serving calls.

Design, the phase tables and the figures: docs/gpu.md §4, §4.1.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from gdncheck.config import REAL, REAL_MOE, GDNConfig
from gdncheck.untrusted import OneLineParser

from .delta_rule_chunked import STATE_CTAS_PER_SM, TEMP_BUDGET, gpu_block_v, slice_rows, temp_bytes_per_token
from .layer import DTYPES, FP32_PARAMS, RECURRENT_MAX_TOKENS
from .moe import MOE_BUDGET, slot_bytes_per_token, token_slice
from .moe_gemm import max_blocks
from .target import dot_precision

ELEMENT_BYTES = {"f32": 4, "bf16": 2, "f16": 2}
H200_BYTES = 141e9  # an H200's HBM, as sold (141 GB)
HEADROOM = 2 << 30
SMS = 132


@dataclass(frozen=True)
class Peak:
    """The largest live set of one call: its phase, its bytes, and what the phases hold."""

    phase: str
    bytes: int
    phases: dict[str, int]
    temporaries: int  # the chunked form's fp32 temporaries (a part of the delta_rule phase)


def per_token(cfg: GDNConfig, profile: str) -> dict[str, int]:
    """Bytes per token of each activation of the layer (the sparse block's too, where the config has experts)."""
    e = ELEMENT_BYTES[profile]
    width = cfg.conv_dim + cfg.num_v_heads * cfg.head_v_dim + 2 * cfg.num_v_heads
    value = cfg.num_v_heads * cfg.head_v_dim
    D, I = cfg.hidden_size, cfg.intermediate_size or 0
    out = {"x": D * e, "x_norm": D * e, "in_proj": width * e, "qkv_conv": cfg.conv_dim * e,
           "g_beta": 8 * cfg.num_v_heads, "core": value * e, "core_gated": value * e, "attn_out": D * e,
           "h": D * e, "h_norm": D * e, "gate_up": 2 * I * e, "act": I * e, "mlp_out": D * e, "out": D * e}
    if cfg.has_experts:
        E, k, Is = cfg.num_experts, cfg.num_experts_per_tok, cfg.shared_expert_intermediate_size
        out.update({"moe_in": (E + 1 + 2 * Is) * e, "routing": 12 * k, "shared_act": Is * e, "shared": D * e,
                    "slots": slot_bytes_per_token(k, D, cfg.moe_intermediate_size, e) + 4 * k})
    return out


def temporaries(cfg: GDNConfig, B: int, T: int, chunk: int = 64, budget: int = TEMP_BUDGET,
                profile: str = "bf16") -> int:
    """Bytes of the chunked form's temporaries in one call (0 for the recurrent form)."""
    if T <= RECURRENT_MAX_TOKENS:
        return 0
    dk, dv, Hv = cfg.head_k_dim, cfg.head_v_dim, cfg.num_v_heads
    per_row = T * temp_bytes_per_token(dk, dv, chunk)
    nv = -(-dv // gpu_block_v(B, Hv, dv, SMS, dot_precision(DTYPES[profile])))
    return slice_rows(B * Hv, per_row, budget, max(1, SMS * STATE_CTAS_PER_SM // nv)) * per_row


def moe_phases(cfg: GDNConfig, B: int, T: int, profile: str = "bf16", moe_budget: int = MOE_BUDGET,
               capture: bool = False) -> dict[str, int]:
    """The live bytes of the sparse block's phases of one call (the module docstring's table)."""
    e, N = ELEMENT_BYTES[profile], B * T
    t = {name: b * N for name, b in per_token(cfg, profile).items()}
    k, D = cfg.num_experts_per_tok, cfg.hidden_size
    base = t["h"] + t["h_norm"] + t["moe_in"] + t["routing"]
    n = token_slice(N, k, D, cfg.moe_intermediate_size, e, moe_budget)
    per_slot = t["slots"] // N
    table = 12 * max_blocks(n * k, cfg.num_experts, 16)  # BM ≥ 16: the most blocks
    outputs = (3 if capture else 1) * D * e * N
    return {"moe_router": base, "moe_shared": base + t["shared_act"] + t["shared"],
            "moe_experts": base + t["shared"] + outputs + n * per_slot + table}


def call_peak(cfg: GDNConfig, B: int, T: int, profile: str = "bf16", chunk: int = 64,
              budget: int = TEMP_BUDGET, mlp_kind: str | None = None, moe_budget: int = MOE_BUDGET) -> Peak:
    """The live bytes of each phase of one call (not counting x, the state and the weights).
    ``mlp_kind``: the layer's (default: the config's, for a config whose layers agree)."""
    conv_state = B * cfg.conv_dim * cfg.conv_kernel * ELEMENT_BYTES[profile] if T > 1 else 0
    return _peak(cfg, B * T, profile, conv_state, temporaries(cfg, B, T, chunk, budget, profile), mlp_kind, moe_budget)


def packed_peak(cfg: GDNConfig, total: int, n: int, profile: str = "bf16", chunk: int = 64,
                budget: int = TEMP_BUDGET, chunked: bool = True, mlp_kind: str | None = None,
                moe_budget: int = MOE_BUDGET) -> Peak:
    """A packed call (gpu_impl/serving.py) of ``n`` sequences, ``total`` tokens: the phases of one
    call over [1, total], without a new conv state (each slot's is written in place), the chunked
    form's temporaries those of one row of ``total`` tokens per value head, sliced by heads (0 for
    the recurrent form: ``chunked`` False). The sparse block is token-wise: its phases are those of
    one call of ``total`` tokens."""
    temps = 0
    if chunked:
        dk, dv, Hv = cfg.head_k_dim, cfg.head_v_dim, cfg.num_v_heads
        per_row = total * temp_bytes_per_token(dk, dv, chunk)
        nv = -(-dv // gpu_block_v(n, Hv, dv, SMS, dot_precision(DTYPES[profile]), varlen=True))
        temps = slice_rows(Hv, per_row, budget, max(1, SMS * STATE_CTAS_PER_SM // (nv * n))) * per_row
    return _peak(cfg, total, profile, 0, temps, mlp_kind, moe_budget)


def verify_steps_bytes(cfg: GDNConfig, total: int, profile: str = "bf16") -> int:
    """What a speculative verify keeps on the device until its commit: every token's conv state
    (profile dtype) and recurrent state (fp32): 2.16 MB per token at Qwen3.5 sizes in bf16."""
    return total * (cfg.conv_dim * cfg.conv_kernel * ELEMENT_BYTES[profile]
                    + 4 * cfg.num_v_heads * cfg.head_k_dim * cfg.head_v_dim)


def _peak(cfg: GDNConfig, tokens: int, profile: str, conv_state: int, temps: int, mlp_kind: str | None,
          moe_budget: int) -> Peak:
    kind = mlp_kind or cfg.mlp_kind()
    t = {name: b * tokens for name, b in per_token(cfg, profile).items()}
    phases = {
        "in_proj": t["x_norm"] + t["in_proj"],
        "conv": t["in_proj"] + t["qkv_conv"] + conv_state,
        "delta_rule": t["in_proj"] + t["qkv_conv"] + t["g_beta"] + t["core"] + temps,
        "gated_norm": t["in_proj"] + t["core"] + t["core_gated"],
        "out_proj": t["core_gated"] + t["attn_out"],
        "post_norm": t["attn_out"] + t["h"] + t["h_norm"],
        "mlp": t["h"] + t["h_norm"] + t["gate_up"] + t["act"],
        "output": t["h"] + t["mlp_out"] + t["out"],
    }
    if kind == "moe":
        del phases["mlp"]
        phases.update(moe_phases(cfg, 1, tokens, profile, moe_budget))
        phases["output"] = phases.pop("output")  # keep the pipeline's order
    phase = max(phases, key=phases.get)
    return Peak(phase, phases[phase], phases, temps)


def resident_bytes(cfg: GDNConfig, B: int, profile: str = "bf16", mlp_kind: str | None = None) -> int:
    """Weights (matrices in the profile dtype, 1-D parameters fp32) and the state of B sequences."""
    from gdncheck.weights import expected_shapes

    e = ELEMENT_BYTES[profile]
    shapes = expected_shapes(cfg, "shared", mlp_kind or cfg.mlp_kind())
    weights = sum((4 if name in FP32_PARAMS else e) * _numel(shape) for name, shape in shapes.items())
    state = B * (cfg.num_v_heads * cfg.head_k_dim * cfg.head_v_dim * 4 + cfg.conv_dim * cfg.conv_kernel * e + 8)
    return weights + state


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def total_bytes(cfg: GDNConfig, B: int, T: int, profile: str = "bf16", chunk: int = 64) -> int:
    """Everything on the device at the call's peak: x, the peak live set, weights, state, headroom."""
    return B * T * per_token(cfg, profile)["x"] + call_peak(cfg, B, T, profile, chunk).bytes + \
        resident_bytes(cfg, B, profile) + HEADROOM


def largest_tokens(cfg: GDNConfig, B: int, profile: str = "bf16", memory: float = H200_BYTES, chunk: int = 64) -> int:
    """The largest T (a multiple of the chunk) such that a call of B sequences of T tokens fits."""
    lo, hi = 0, 1 << 26
    while hi - lo > chunk:
        mid = (lo + hi) // 2 // chunk * chunk
        lo, hi = (mid, hi) if total_bytes(cfg, B, max(mid, chunk), profile, chunk) <= memory else (lo, mid)
    return lo


def report(cfg: GDNConfig, B: int, T: int, profile: str, memory: float) -> str:
    peak = call_peak(cfg, B, T, profile)
    pt = per_token(cfg, profile)
    total = total_bytes(cfg, B, T, profile)
    lines = [f"layer call B={B}, T={T}, {profile}: peak in {peak.phase}: {peak.bytes / 1e9:.1f} GB live "
             f"(chunked temporaries {peak.temporaries / 1e9:.2f} GB), + x {B * T * pt['x'] / 1e9:.1f} GB, "
             f"weights and state {resident_bytes(cfg, B, profile) / 1e9:.2f} GB, headroom {HEADROOM / 1e9:.1f} GB "
             f"= {total / 1e9:.1f} GB of {memory / 1e9:.0f} GB: {'fits' if total <= memory else 'does NOT fit'}",
             f"largest T at B={B}: {largest_tokens(cfg, B, profile, memory)} tokens"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:

    p = OneLineParser(prog="python -m gdncheck.gpu_impl.memory", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--profile", choices=tuple(ELEMENT_BYTES), default="bf16")
    p.add_argument("--memory-gb", type=float, default=H200_BYTES / 1e9)
    p.add_argument("--moe", action="store_true", help="the layer with the sparse block (E 512, top 10, I_moe 512)")
    args = p.parse_args(argv)
    print(report(REAL_MOE if args.moe else REAL, args.batch, args.tokens, args.profile, args.memory_gb * 1e9))
    return 0


if __name__ == "__main__":
    sys.exit(main())
