"""The GDN layer at a precision profile: float64 math replaced by an engine's roundings.

`EmulatedLayer` is the layer a correct port of a profile computes: activations stored in the
profile's dtype (`f32`, `bf16` or `f16`), every stage's math in float32, matrix products
accumulated in float32, the recurrent state in float32. Where it rounds is the *placement*
(`hf`, `fla`, `fp32_once`, and the held-out `metrale`), with a summation order from `.lowp.ORDERS`
written `NAME:ORDER` (`hf:sequential`; plain `NAME` is `NAME:blas`). A sparse layer
(`cfg.mlp_kind`) runs `.emulate_moe`'s block in place of the dense MLP. Subclasses (the mutants of
`gdncheck.conformance.meta`) override one stage method each.

The placements and orders, and why: docs/tolerances.md §2, §2.1 (docs/math.md §4).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from gdncheck.calls import check_seq_pos, check_state, check_x, rows_to_reset
from gdncheck.config import GDNConfig
from gdncheck.errors import InputError
from gdncheck.harness import LayerAdapter, method_stage_runner, plain_serving
from gdncheck.profiles import VERIFY_PROFILES
from gdncheck.snapshot import Snapshot
from gdncheck.weights import conv_weight_2d, validate_weights

from . import lowp
from .emulate_moe import MOE_ROUNDINGS, MoEStages
from .lowp import F32, f32

log = logging.getLogger("gdncheck.conformance.earn.emulate")



@dataclass(frozen=True)
class Placement:
    name: str
    conv_two_roundings: bool  # round the conv sum, then SiLU the rounded value
    qk_stored: bool  # q, k leave qk_norm rounded to the activation dtype
    beta_stored: bool  # beta leaves gates rounded to the activation dtype
    chunked: bool  # chunked delta rule for T > 1 (else recurrent)
    fla_chunk: bool  # chunked rule with FLA's low-precision intermediates
    scale_at: str  # "q" or "out"
    gated_norm: str  # "hf", "fused" or "metrale"
    mlp_intermediates_stored: bool
    softplus_threshold: float | None
    order: str = "blas"  # summation order (lowp.ORDERS)
    moe: str = "hf"  # the sparse block's roundings (emulate_moe.MOE_ROUNDINGS)


PLACEMENTS: dict[str, Placement] = {
    "hf": Placement("hf", True, False, True, True, False, "q", "hf", True, 20.0, moe="hf"),
    "fla": Placement("fla", False, True, False, True, True, "q", "fused", False, None, moe="fused"),
    "fp32_once": Placement("fp32_once", False, True, True, False, False, "q", "fused", False, None, moe="fp32_once"),
    "metrale": Placement("metrale", False, True, False, False, False, "out", "metrale", False, 20.0, moe="metrale"),
}
#: The placements whose error envelope defines the tolerances; ``metrale`` is held out.
DERIVATION_PLACEMENTS = ("hf", "fla", "fp32_once")
#: The summation orders each derivation placement runs with (docs/tolerances.md §2).
DERIVATION_ORDERS = lowp.ORDERS


def placement_of(spec: str) -> Placement:
    """``NAME`` or ``NAME:ORDER`` (a placement of :data:`PLACEMENTS`, a summation order of
    :data:`.lowp.ORDERS` or ``blocked<N>``) -> the placement with that order."""
    name, _, order = spec.partition(":")
    if name not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)} (optionally :ORDER), found {spec!r}")
    if not order:
        return PLACEMENTS[name]
    try:
        lowp.block_of(order)
    except ValueError as exc:
        raise ValueError(f"placement {spec!r}: {exc}") from None
    return replace(PLACEMENTS[name], name=spec, order=order)


class EmulatedState:
    """conv_state [B, conv_dim, K] (activation dtype), recurrent_state [B, Hv, dk, dv] float32,
    seq_len [B]; updated in place by :meth:`EmulatedLayer.forward`."""

    def __init__(self, cfg: GDNConfig, batch: int):
        self.cfg = cfg
        self.conv_state = np.zeros((batch, cfg.conv_dim, cfg.conv_kernel), dtype=F32)
        self.recurrent_state = np.zeros((batch, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim), dtype=F32)
        self.seq_len = np.zeros(batch, dtype=np.int64)
        self.warned = False

    @property
    def batch(self) -> int:
        return int(self.seq_len.shape[0])

    def reset(self, rows) -> None:
        self.conv_state[rows] = 0.0
        self.recurrent_state[rows] = 0.0
        self.seq_len[rows] = 0

    def snapshot(self) -> Snapshot:
        return Snapshot(self.conv_state, self.recurrent_state, self.seq_len, self.cfg.state_fingerprint(), self.warned)

    def restore(self, snap: Snapshot) -> None:
        snap.check_compatible(self.cfg.state_fingerprint(), self.batch)
        self.conv_state[...] = snap.conv_state
        self.recurrent_state[...] = snap.recurrent_state
        self.seq_len[...] = snap.seq_len
        self.warned = bool(snap.warned)


class EmulatedLayer(MoEStages):
    """The layer at ``profile`` with the roundings of ``placement`` (see the module docstring).

    Same interface as ``gdncheck.reference.Layer``: ``new_state(batch)``, ``forward(x, state,
    seq_pos) -> (out, trace)`` with the state updated in place. Tensors are float32 arrays.
    """

    def __init__(self, cfg: GDNConfig, weights: Mapping[str, np.ndarray], layer_index: int | None = None, *,
                 profile: str = "bf16", placement: str = "hf", strict: bool = False, chunk_size: int = 64):
        if profile not in VERIFY_PROFILES:
            raise ValueError(f"profile must be one of {', '.join(VERIFY_PROFILES)}, found {profile!r}")
        if layer_index is None:
            layer_index = getattr(weights, "layer", None)
        self.cfg = cfg
        self.layer_index = layer_index
        self.norm_mode = validate_weights(cfg, weights, layer=layer_index)
        self.mlp_kind = cfg.mlp_kind(layer_index)
        self.profile = profile
        self.p = placement_of(placement)
        self.moe_rounding = MOE_ROUNDINGS[self.p.moe]
        self.order = self.p.order
        self.strict = strict
        self.chunk_size = chunk_size
        # weights as the engine holds them: stored values (bf16/f16-exact), read as float32
        self.w = {name: f32(arr) for name, arr in weights.items()}
        self.w["linear_attn.conv1d.weight"] = conv_weight_2d(self.w["linear_attn.conv1d.weight"])
        if self.mlp_kind == "moe":
            self.prepare_moe()

    def store(self, x: np.ndarray) -> np.ndarray:
        return lowp.store(x, self.profile)

    def matmul_t(self, x, w):
        return lowp.matmul_t(x, w, self.order)

    # --- stages (docs/spec.md §2), each returning the tensors of the same name ---------------------------
    # the nonlinearities, one method each, so that a mutant (conformance/meta) replaces one of them
    def rms_normalize(self, x):
        """x / sqrt(mean(x^2) + eps) in float32 (the layer RMSNorms)."""
        return lowp.rms_normalize(f32(x), self.cfg.rms_norm_eps, self.order)

    def gated_normalize(self, core):
        """core / sqrt(mean_dv(core^2) + eps) in float32 (the gated RMSNorm's normalisation)."""
        return lowp.rms_normalize(f32(core), self.cfg.rms_norm_eps, self.order)

    def l2_normalize(self, x):
        """x / sqrt(sum(x^2) + 1e-6) in float32 (q and k)."""
        return lowp.l2_normalize(x, order=self.order)

    def softplus(self, x):
        return lowp.softplus(x, self.p.softplus_threshold)

    def sigmoid(self, b):
        return lowp.sigmoid(b)

    def rms_norm_one_plus(self, x, weight):
        """RMSNorm with (1 + w) in float32, rounded once (HF, vLLM GemmaRMSNorm)."""
        return self.store(self.rms_normalize(x) * (F32(1) + weight))

    def input_norm(self, x):
        return self.rms_norm_one_plus(x, self.w["input_layernorm.weight"])

    def in_proj(self, x_norm):
        w = self.w
        B, T = x_norm.shape[:2]
        qkv = self.store(self.matmul_t(x_norm, w["linear_attn.in_proj_qkv.weight"]))
        z = self.store(self.matmul_t(x_norm, w["linear_attn.in_proj_z.weight"]))
        a = self.store(self.matmul_t(x_norm, w["linear_attn.in_proj_a.weight"]))
        b = self.store(self.matmul_t(x_norm, w["linear_attn.in_proj_b.weight"]))
        return qkv, z.reshape(B, T, self.cfg.num_v_heads, self.cfg.head_v_dim), a, b

    def conv1d(self, qkv, conv_state):
        w = self.w["linear_attn.conv1d.weight"]
        K, T = w.shape[1], qkv.shape[1]
        full = np.concatenate([np.swapaxes(f32(conv_state), 1, 2), f32(qkv)], axis=1)  # [B, K + T, C]
        y = np.zeros(qkv.shape, dtype=F32)
        for j in range(K):
            y += w[:, j] * full[:, 1 + j: 1 + j + T]
        if self.p.conv_two_roundings:
            y = self.store(y)
        new_state = self.store(np.swapaxes(full[:, -K:], 1, 2))
        return self.store(lowp.silu(y)), np.ascontiguousarray(new_state)

    def split_qkv(self, qkv_conv):
        c = self.cfg
        B, T = qkv_conv.shape[:2]
        q = qkv_conv[..., : c.key_dim].reshape(B, T, c.num_k_heads, c.head_k_dim)
        k = qkv_conv[..., c.key_dim: 2 * c.key_dim].reshape(B, T, c.num_k_heads, c.head_k_dim)
        v = qkv_conv[..., 2 * c.key_dim:].reshape(B, T, c.num_v_heads, c.head_v_dim)
        return q, k, v

    def qk_norm(self, qkv_conv):
        q, k, v = self.split_qkv(f32(qkv_conv))
        q, k = self.l2_normalize(q), self.l2_normalize(k)
        if self.p.qk_stored:
            q, k = self.store(q), self.store(k)
        return q, k, v

    def gates(self, a, b):
        x = f32(a) + self.w["linear_attn.dt_bias"]
        g = -np.exp(self.w["linear_attn.A_log"]) * self.softplus(x)
        beta = self.sigmoid(f32(b))
        return g, (self.store(beta) if self.p.beta_stored else beta)

    def expand(self, x):
        return lowp.expand_heads(x, self.cfg.num_v_heads)

    def delta_rule(self, q, k, v, g, beta, recurrent_state):
        qe, ke = self.expand(f32(q)), self.expand(f32(k))
        v, g, beta = f32(v), f32(g), f32(beta)
        if self.p.chunked and v.shape[1] > 1:
            core, S = lowp.delta_rule_chunked_f32(
                qe, ke, v, g, beta, recurrent_state, self.cfg.scale, chunk_size=self.chunk_size,
                lowp=self.store if self.p.fla_chunk else None,
                scale_at="out" if self.p.fla_chunk else self.p.scale_at, order=self.order)
        else:
            core, S = lowp.delta_rule_recurrent_f32(qe, ke, v, g, beta, recurrent_state, self.cfg.scale,
                                                    scale_at=self.p.scale_at, order=self.order)
        return self.store(core), S

    def norm_weight(self):
        w = self.w["linear_attn.norm.weight"]
        c = self.cfg
        return w.reshape(c.num_v_heads, c.head_v_dim) if self.norm_mode == "per_head" else w

    def output_gate(self, z):
        """silu(z), the gated norm's gate, in float32."""
        return lowp.silu(f32(z))

    def gated_norm(self, core, z):
        w = self.norm_weight()
        normed = self.gated_normalize(core)
        gate = self.output_gate(z)
        if self.p.gated_norm == "hf":
            return self.store(self.store(self.store(normed) * w) * gate)
        if self.p.gated_norm == "metrale":
            return self.store(normed * w) * gate  # the gate is applied in fp32 inside the out_proj GEMV
        return self.store(normed * w * gate)

    def out_proj(self, core_gated):
        B, T = core_gated.shape[:2]
        return self.store(self.matmul_t(f32(core_gated).reshape(B, T, -1), self.w["linear_attn.out_proj.weight"]))

    def residual(self, x, attn_out):
        return self.store(f32(x) + f32(attn_out))

    def post_norm(self, h):
        return self.rms_norm_one_plus(h, self.w["post_attention_layernorm.weight"])

    def mlp(self, h_norm):
        w, s = self.w, (self.store if self.p.mlp_intermediates_stored else (lambda a: a))
        gate = s(self.matmul_t(h_norm, w["mlp.gate_proj.weight"]))
        up = s(self.matmul_t(h_norm, w["mlp.up_proj.weight"]))
        act = s(s(lowp.silu(gate)) * up)
        return self.store(self.matmul_t(act, w["mlp.down_proj.weight"]))

    def output(self, h, mlp_out):
        return self.store(f32(h) + f32(mlp_out))

    # --- the layer --------------------------------------------------------------------------------
    def new_state(self, batch: int = 1) -> EmulatedState:
        return EmulatedState(self.cfg, batch)

    def apply_seq_pos_rule(self, state: EmulatedState, pos: np.ndarray) -> None:
        """The seq_pos rule (docs/spec.md §4, :func:`gdncheck.calls.rows_to_reset`): rows whose seq_len
        differs from seq_pos are reset (strict: refused, nothing changed)."""
        reset, state.warned = rows_to_reset(pos, state.seq_len, strict=self.strict, warned=state.warned,
                                            layer=self.layer_index, logger=log)
        if reset.any():
            state.reset(reset)

    def check_input(self, x, state: EmulatedState) -> np.ndarray:
        """The call contract's input checks (:mod:`gdncheck.calls`), shared with every other layer."""
        if not isinstance(state, EmulatedState):
            raise InputError(f"expected an emulated-layer State, found {type(state).__name__}", layer=self.layer_index)
        check_state(state.cfg, self.cfg, self.layer_index)
        arr = np.asarray(x)
        check_x(arr.shape, arr.dtype.kind == "f", arr.dtype, self.cfg, state.batch, self.layer_index)
        return arr

    def forward(self, x, state: EmulatedState, seq_pos):
        x = self.check_input(x, state)
        pos = check_seq_pos(seq_pos, np.asarray(seq_pos), state.batch, self.layer_index)
        self.apply_seq_pos_rule(state, pos)
        with np.errstate(all="ignore"):  # IEEE arithmetic: an overflow is an inf, as on the hardware modelled
            return self._forward(x, state, pos)

    def _forward(self, x, state: EmulatedState, pos):
        x = self.store(f32(x))
        x_norm = self.input_norm(x)
        qkv, z, a, b = self.in_proj(x_norm)
        qkv_conv, conv_state = self.conv1d(qkv, state.conv_state)
        q, k, v = self.qk_norm(qkv_conv)
        g, beta = self.gates(a, b)
        core, rec_state = self.delta_rule(q, k, v, g, beta, state.recurrent_state)
        core_gated = self.gated_norm(core, z)
        attn_out = self.out_proj(core_gated)
        h = self.residual(x, attn_out)
        h_norm = self.post_norm(h)
        block = self.moe_block(h_norm) if self.mlp_kind == "moe" else {"mlp_out": self.mlp(h_norm)}
        out = self.output(h, block["mlp_out"])
        self.commit_state(state, conv_state, rec_state, pos + x.shape[1])
        trace = {"x": x, "x_norm": x_norm, "qkv": qkv, "z": z, "a": a, "b": b, "qkv_conv": qkv_conv, "q": q,
                 "k": k, "v": v, "g": g, "beta": beta, "core": core, "core_gated": core_gated,
                 "attn_out": attn_out, "h": h, "h_norm": h_norm, **block, "out": out}
        return out, trace

    def commit_state(self, state: EmulatedState, conv_state, rec_state, seq_len) -> None:
        """Write the new state into ``state``'s arrays in place."""
        state.conv_state[...] = conv_state
        state.recurrent_state[...] = rec_state
        state.seq_len[...] = seq_len


# --- the emulated layer as an implementation of the port contract ---------------------------------
def emulated_adapter(layer: EmulatedLayer, name: str) -> LayerAdapter:
    """``layer`` (an :class:`EmulatedLayer` or a mutant of it) as an implementation of the port
    contract, with stage-isolated mode through its stage methods, and the serving ops as plain calls
    (their definition: what it earns bounds with on serving cases)."""
    keep = layer.moe_keep_f32() if layer.mlp_kind == "moe" else ()
    run_stage = method_stage_runner(layer, layer.store, keep_f32=keep)

    def quiet_run_stage(stage, inputs):  # as forward: the modelled hardware does not warn on an overflow
        with np.errstate(all="ignore"):
            return run_stage(stage, inputs)

    return LayerAdapter(layer, name, load_snapshot=Snapshot.load, stage_runner=quiet_run_stage, serving=plain_serving)


def emulated(cfg: GDNConfig, weights, *, profile: str = "bf16", strict: bool = False, placement: str = "hf",
             chunk_size: int = 64) -> LayerAdapter:
    """A factory of the port contract: the reference's math with ``profile``'s roundings at ``placement``
    (what the built-in ``reference`` runs in f32, bf16 and f16)."""
    layer = EmulatedLayer(cfg, weights, profile=profile, placement=placement, strict=strict, chunk_size=chunk_size)
    return emulated_adapter(layer, f"reference ({profile} emulated, placement {placement})")

