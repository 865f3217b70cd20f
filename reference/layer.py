"""The whole GDN decoder layer: the stages of docs/spec.md §2 composed, with its state (docs/spec.md §4).

A layer whose config gives it the sparse mixture-of-experts block (``cfg.mlp_kind(layer)``) runs
:func:`.moe.mlp_moe` in place of the dense MLP; its trace carries the block's tensors too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gdncheck.calls import check_seq_pos, check_state, check_x, rows_to_reset
from gdncheck.config import GDNConfig
from gdncheck.errors import InputError, LayerOptionError
from gdncheck.experts import (
    EXPERTS_DOWN,
    EXPERTS_GATE_UP,
    ROUTER,
    SHARED_DOWN,
    SHARED_EXPERT_GATE,
    SHARED_GATE,
    SHARED_UP,
    split_gate_up,
)
from gdncheck.weights import validate_weights

from .conv1d import conv1d
from .delta_rule import delta_rule_recurrent
from .delta_rule_chunked import delta_rule_chunked
from .gated_norm import gated_norm
from .gates import gates
from .in_proj import in_proj
from .input_norm import input_norm
from .mlp import mlp
from .moe import mlp_moe
from .out_proj import out_proj
from .post_norm import post_norm
from .qk_norm import qk_norm
from .residual import output, residual
from .state import State

log = logging.getLogger("gdncheck.reference")

DELTA_RULE_FORMS = ("auto", "recurrent", "chunked")


def check_layer_options(delta_rule, chunk_size, layer: int | None = None) -> None:
    """Refuse (:class:`LayerOptionError`, a ``ValueError`` too) a ``delta_rule`` that is none of
    :data:`DELTA_RULE_FORMS` or a ``chunk_size`` that is no positive integer; ``None`` (the layer's
    own setting) passes."""
    if delta_rule is not None and (not isinstance(delta_rule, str) or delta_rule not in DELTA_RULE_FORMS):
        raise LayerOptionError(f"expected delta_rule one of {', '.join(DELTA_RULE_FORMS)}, found {delta_rule!r}",
                               layer=layer)
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int | np.integer)
                                   or chunk_size < 1):
        raise LayerOptionError(f"expected chunk_size a positive integer, found {chunk_size!r}", layer=layer)


@dataclass(frozen=True)
class Params:
    """Weights as float64 arrays, by their Hugging Face names."""

    w: Mapping[str, np.ndarray]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.w[name]


def layer_forward(
    cfg: GDNConfig,
    params: Params,
    x: np.ndarray,
    conv_state: np.ndarray,
    recurrent_state: np.ndarray,
    *,
    delta_rule: str = "auto",
    chunk_size: int = 64,
    mlp_kind: str | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """One call over T tokens of B sequences, as a pure function.

    x: [B, T, D]; conv_state: [B, conv_dim, K]; recurrent_state: [B, Hv, dk, dv].
    Returns out [B, T, D], the new conv and recurrent states, and the trace: every stage tensor of
    docs/spec.md §2 by name. ``delta_rule``: ``auto`` (chunked when T > 1, recurrent for one token),
    ``recurrent`` or ``chunked``. ``mlp_kind``: ``dense`` or ``moe`` (default: the config's, for a
    config whose layers all have the same block).
    """
    check_layer_options(delta_rule, chunk_size)
    eps = cfg.rms_norm_eps
    T = x.shape[1]
    x_norm = input_norm(x, params["input_layernorm.weight"], eps)
    qkv, z, a, b = in_proj(
        x_norm,
        params["linear_attn.in_proj_qkv.weight"],
        params["linear_attn.in_proj_z.weight"],
        params["linear_attn.in_proj_a.weight"],
        params["linear_attn.in_proj_b.weight"],
    )
    qkv_conv, conv_state = conv1d(qkv, conv_state, params["linear_attn.conv1d.weight"])
    q, k, v = qk_norm(qkv_conv, cfg.num_k_heads, cfg.head_k_dim, cfg.num_v_heads, cfg.head_v_dim)
    g, beta = gates(a, b, params["linear_attn.A_log"], params["linear_attn.dt_bias"])
    form = ("recurrent" if T == 1 else "chunked") if delta_rule == "auto" else delta_rule
    if form == "recurrent":
        core, recurrent_state = delta_rule_recurrent(q, k, v, g, beta, recurrent_state, cfg.scale)
    else:
        core, recurrent_state = delta_rule_chunked(q, k, v, g, beta, recurrent_state, cfg.scale, chunk_size)
    core_gated = gated_norm(core, z, params["linear_attn.norm.weight"], eps)
    attn_out = out_proj(core_gated, params["linear_attn.out_proj.weight"])
    trace = {
        "x": x, "x_norm": x_norm, "qkv": qkv, "z": z, "a": a, "b": b, "qkv_conv": qkv_conv,
        "q": q, "k": k, "v": v, "g": g, "beta": beta, "core": core, "core_gated": core_gated,
    }
    out, tail = layer_tail(cfg, params, x, attn_out, mlp_kind=mlp_kind)
    trace.update(tail)
    return out, conv_state, recurrent_state, trace


def layer_tail(cfg: GDNConfig, params: Params, x: np.ndarray, attn_out: np.ndarray, *,
               mlp_kind: str | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The stages after ``out_proj`` (residual, post norm, the MLP or MoE block, output), from the layer's
    input ``x`` and ``attn_out`` (a tensor-parallel layer's all-reduced partials). Returns ``out`` and those
    stages' tensors by name (``attn_out`` among them)."""
    eps = cfg.rms_norm_eps
    h = residual(x, attn_out)
    h_norm = post_norm(h, params["post_attention_layernorm.weight"], eps)
    trace = {"attn_out": attn_out, "h": h, "h_norm": h_norm}
    if (mlp_kind or cfg.mlp_kind()) == "moe":
        w_gate, w_up = split_gate_up(params[EXPERTS_GATE_UP], cfg.moe_intermediate_size)
        block = mlp_moe(
            h_norm, params[ROUTER], w_gate, w_up, params[EXPERTS_DOWN], params[SHARED_GATE], params[SHARED_UP],
            params[SHARED_DOWN], params[SHARED_EXPERT_GATE], cfg.num_experts_per_tok, cfg.norm_topk_prob,
        )
        names = ("router_logits", "routing_weights", "selected_experts", "experts_out", "shared_out", "mlp_out")
        trace.update(zip(names, block))
        mlp_out = block[-1]
    else:
        mlp_out = mlp(h_norm, params["mlp.gate_proj.weight"], params["mlp.up_proj.weight"],
                      params["mlp.down_proj.weight"])
        trace["mlp_out"] = mlp_out
    out = output(h, mlp_out)
    trace["out"] = out
    return out, trace


class Layer:
    """The float64 reference of one GDN decoder layer.

    >>> layer = Layer(cfg, weights)
    >>> state = layer.new_state(batch=2)
    >>> out, trace = layer.forward(x, state, seq_pos=0)     # x: [2, T, D]; state updated in place

    ``strict=True`` raises :class:`SeqPosMismatchError` where the default resets the state and
    logs a warning once per state.
    """

    def __init__(
        self,
        cfg: GDNConfig,
        weights: Mapping[str, np.ndarray],
        layer_index: int | None = None,
        *,
        strict: bool = False,
        delta_rule: str = "auto",
        chunk_size: int = 64,
    ):
        if layer_index is None:
            layer_index = getattr(weights, "layer", None)
        check_layer_options(delta_rule, chunk_size, layer_index)
        self.cfg = cfg
        self.layer_index = layer_index
        self.norm_mode = validate_weights(cfg, weights, layer=layer_index)
        self.mlp_kind = cfg.mlp_kind(layer_index)
        self.params = Params({name: np.array(arr, dtype=np.float64) for name, arr in weights.items()})
        self.strict = strict
        self.delta_rule = delta_rule
        self.chunk_size = chunk_size

    def new_state(self, batch: int = 1) -> State:
        return State(self.cfg, batch)

    def forward(
        self,
        x: np.ndarray,
        state: State,
        seq_pos,
        *,
        strict: bool | None = None,
        delta_rule: str | None = None,
        chunk_size: int | None = None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Run T tokens of each sequence; update ``state`` in place; return ``(out, trace)``.

        x: [B, T, D] floating point; seq_pos: the position of the first token, an int or one per
        sequence. A row whose state ``seq_len`` differs from its ``seq_pos`` is reset to zeros first.
        """
        check_layer_options(delta_rule, chunk_size, self.layer_index)  # before anything changes
        x = self._check_input(x, state)
        pos = check_seq_pos(seq_pos, np.asarray(seq_pos), state.batch, self.layer_index)
        strict = self.strict if strict is None else strict
        reset, state.warned = rows_to_reset(pos, state.seq_len, strict=strict, warned=state.warned,
                                            layer=self.layer_index, logger=log)
        if reset.any():
            state.reset(reset)
        out, conv_state, rec_state, trace = layer_forward(
            self.cfg, self.params, x, state.conv_state, state.recurrent_state,
            delta_rule=delta_rule or self.delta_rule, chunk_size=chunk_size or self.chunk_size,
            mlp_kind=self.mlp_kind,
        )
        state.conv_state = conv_state
        state.recurrent_state = rec_state
        state.seq_len = pos + x.shape[1]
        return out, trace

    # --- input checks -----------------------------------------------------------------------------
    def _check_input(self, x, state: State) -> np.ndarray:
        if not isinstance(state, State):
            raise InputError(f"expected a reference State, found {type(state).__name__}", layer=self.layer_index)
        check_state(state.cfg, self.cfg, self.layer_index)
        arr = np.asarray(x)
        check_x(arr.shape, arr.dtype.kind == "f", arr.dtype, self.cfg, state.batch, self.layer_index)
        return arr.astype(np.float64)
