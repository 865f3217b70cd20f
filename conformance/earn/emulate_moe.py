"""The sparse mixture-of-experts block of the precision-emulating layer (`.emulate`).

The formulas are reference/moe.py's; the arithmetic is an engine's: float32 math, every GEMM
accumulated in float32 in the placement's summation order (`.lowp`), and the roundings to the
activation dtype where the engine makes them (`MOE_ROUNDINGS`, one per placement). The softmax, the
top-k (exact ties to the lower index) and the renormalisation are float32 in every engine, and
`mlp_out` is the rounded sum of the rounded `experts_out` and `shared_out`.

Each placement's roundings: docs/tolerances.md §2 (the sparse block's column); docs/moe.md,
"The precision-emulating layer".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gdncheck.experts import (
    EXPERTS_DOWN,
    EXPERTS_GATE_UP,
    ROUTER,
    SHARED_DOWN,
    SHARED_EXPERT_GATE,
    SHARED_GATE,
    SHARED_UP,
)

from . import lowp
from .lowp import F32, f32

#: The block's tensors in a sparse layer's trace, in pipeline order (gdncheck.stages).
BLOCK_TENSORS = ("router_logits", "routing_weights", "selected_experts", "experts_out", "shared_out", "mlp_out")


@dataclass(frozen=True)
class MoERounding:
    """Where an engine rounds the sparse block to the activation dtype (the module docstring)."""

    name: str
    logits_stored: bool  # router logits rounded (the router GEMM's output)
    weights_stored: bool  # routing weights rounded after the fp32 renormalisation
    gate_up_stored: bool  # each expert's (and the shared expert's) gate and up GEMM outputs rounded
    act: str  # "two": silu(gate) rounded, then × up rounded; "one": SwiGLU fused, one rounding; "fp32"
    slot: str  # "down_then_weight": down rounded, × weight rounded; "weighted": down × weight rounded once; "fp32"
    combine: str  # "dtype_by_expert": index_add_ in the dtype, experts in index order; "fp32_by_slot"
    shared_gate: str  # "rounded": down, gate logit, sigmoid, product each rounded; "fp32": product rounded once


MOE_ROUNDINGS: dict[str, MoERounding] = {
    "hf": MoERounding("hf", True, True, True, "two", "down_then_weight", "dtype_by_expert", "rounded"),
    "fused": MoERounding("fused", True, False, True, "one", "weighted", "fp32_by_slot", "rounded"),
    "fp32_once": MoERounding("fp32_once", True, True, False, "fp32", "fp32", "fp32_by_slot", "fp32"),
    "metrale": MoERounding("metrale", False, False, False, "one", "fp32", "fp32_by_slot", "fp32"),
}


class MoEStages:
    """The block's stage methods of :class:`~.emulate.EmulatedLayer` (a mixin: it reads the layer's
    ``cfg``, ``w``, ``store``, ``matmul_t``, ``order`` and ``moe_rounding``)."""

    def prepare_moe(self) -> None:
        """The experts' gate and up views of the stacked ``gate_up_proj`` (float32, as held)."""
        Im = self.cfg.moe_intermediate_size
        gate_up = self.w[EXPERTS_GATE_UP]
        self.w_expert_gate, self.w_expert_up = gate_up[:, :Im], gate_up[:, Im:]

    def moe_keep_f32(self) -> tuple[str, ...]:
        """The block's tensors this engine holds in fp32: golden inputs of those names are read as
        fp32, not stored in the activation dtype (stage-isolated mode)."""
        r = self.moe_rounding
        return (() if r.logits_stored else ("router_logits",)) + (() if r.weights_stored else ("routing_weights",))

    def _swiglu(self, x, w_gate, w_up):
        r = self.moe_rounding
        g, u = self.matmul_t(x, w_gate), self.matmul_t(x, w_up)
        if r.gate_up_stored:
            g, u = self.store(g), self.store(u)
        if r.act == "two":
            return self.store(self.store(lowp.silu(g)) * u)
        if r.act == "one":
            return self.store(lowp.silu(g) * u)
        return lowp.silu(g) * u

    # --- stages, each returning the tensors of the same name ---------------------------------------
    def router(self, h_norm):
        logits = self.matmul_t(f32(h_norm), self.w[ROUTER])
        return self.store(logits) if self.moe_rounding.logits_stored else logits

    def routing(self, router_logits):
        """fp32 softmax, the top_k by probability (a stable sort: exact ties to the lower index),
        renormalised in fp32 where the config says; returns (routing_weights, selected_experts int64)."""
        return self.route(router_logits, self.cfg.norm_topk_prob)

    def route(self, router_logits, renormalise: bool):
        l = f32(router_logits)
        z = np.exp(l - l.max(axis=-1, keepdims=True))
        p = z / lowp.sum_last(z, self.order)
        selected = np.argsort(-p, axis=-1, kind="stable")[..., : self.cfg.num_experts_per_tok]
        weights = np.take_along_axis(p, selected, axis=-1)
        if renormalise:
            weights = weights / lowp.sum_last(weights, self.order)
        if self.moe_rounding.weights_stored:
            weights = self.store(weights)
        return weights, selected.astype(np.int64)

    def experts(self, h_norm, routing_weights, selected_experts):
        x = f32(h_norm)
        D, k, r = x.shape[-1], selected_experts.shape[-1], self.moe_rounding
        x2 = x.reshape(-1, D)
        sel = np.asarray(selected_experts, dtype=np.int64).reshape(-1, k)
        rw = f32(routing_weights).reshape(-1, k)
        slots = np.zeros((x2.shape[0], k, D), dtype=F32)
        out = np.zeros_like(x2)
        for e in np.unique(sel):  # ascending: transformers' index_add_ adds the experts in this order
            tok, j = np.nonzero(sel == e)  # a token chooses an expert at most once
            act = self._swiglu(x2[tok], self.w_expert_gate[e], self.w_expert_up[e])
            y = self.matmul_t(act, self.w[EXPERTS_DOWN][e])
            w = rw[tok, j][:, None]
            if r.slot == "down_then_weight":
                y = self.store(self.store(y) * w)
            elif r.slot == "weighted":
                y = self.store(y * w)
            else:
                y = y * w
            if r.combine == "dtype_by_expert":
                out[tok] = self.store(out[tok] + y)
            else:
                slots[tok, j] = y
        if r.combine != "dtype_by_expert":
            out = slots[:, 0].copy()
            for j in range(1, k):  # slot order, one float32 accumulator
                out += slots[:, j]
            out = self.store(out)
        return out.reshape(x.shape)

    def shared_expert(self, h_norm):
        x = f32(h_norm)
        act = self._swiglu(x, self.w[SHARED_GATE], self.w[SHARED_UP])
        down = self.matmul_t(act, self.w[SHARED_DOWN])
        logit = self.matmul_t(x, self.w[SHARED_EXPERT_GATE])  # [..., 1]
        if self.moe_rounding.shared_gate == "rounded":
            return self.store(self.store(lowp.sigmoid(self.store(logit))) * self.store(down))
        return self.store(lowp.sigmoid(logit) * down)

    def moe_sum(self, experts_out, shared_out):
        """Stage ``mlp`` of a sparse layer: experts_out + shared_out, one rounding."""
        return self.store(f32(experts_out) + f32(shared_out))

    def moe_block(self, h_norm) -> dict:
        """The block through the stage methods (a mutant's override takes effect): its tensors by name,
        in pipeline order, leaving out any a stage does not compute (None)."""
        router_logits = self.router(h_norm)
        routing_weights, selected_experts = self.routing(router_logits)
        experts_out = self.experts(h_norm, routing_weights, selected_experts)
        shared_out = self.shared_expert(h_norm)
        mlp_out = self.moe_sum(experts_out, shared_out)
        values = (router_logits, routing_weights, selected_experts, experts_out, shared_out, mlp_out)
        return {name: v for name, v in zip(BLOCK_TENSORS, values) if v is not None}
