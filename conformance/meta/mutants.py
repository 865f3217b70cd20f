"""Mutant implementations: the correct emulated layer
(:class:`~gdncheck.conformance.earn.emulate.EmulatedLayer`) with one known bug each (docs/spec.md §6;
where each bug class comes from: docs/math.md §5).

Each mutant overrides one method. ``MUTANTS`` names each with the stage where ``verify`` must first
see it, and, where the bug only shows on a later call, the case and call where it must first show.
Every mutant is also a plug-in factory::

    gdncheck run gdncheck.conformance.meta.mutants:head_grouping_tiled --profile bf16 --out out/
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gdncheck.conformance.earn import lowp
from gdncheck.conformance.earn.emulate import EmulatedLayer, EmulatedState, emulated_adapter
from gdncheck.conformance.earn.lowp import F32, f32
from gdncheck.snapshot import Snapshot


class HeadGroupingTiled(EmulatedLayer):
    """Value head j reads key head j % Hk (torch ``tile``/ggml broadcast) instead of j // r."""

    def expand(self, x):
        return np.tile(x, (1,) * (x.ndim - 2) + (self.cfg.num_v_heads // x.shape[-2], 1))


class NormWeightPlain(EmulatedLayer):
    """The layer RMSNorms apply w instead of (1 + w) (doppler's rmsNormWeightOffset flip-flop)."""

    def rms_norm_one_plus(self, x, weight):
        return self.store(lowp.rms_normalize(f32(x), self.cfg.rms_norm_eps) * weight)


class MissingL2Norm(EmulatedLayer):
    """q and k are not L2-normalised (use_qk_l2norm_in_kernel forgotten)."""

    def qk_norm(self, qkv_conv):
        return self.split_qkv(f32(qkv_conv))


class ScaleDoubled(EmulatedLayer):
    """The query scale dk^-0.5 applied twice (q pre-scaled as in HF and the output scaled as in metrale)."""

    def delta_rule(self, q, k, v, g, beta, recurrent_state):
        return super().delta_rule(f32(q) * F32(self.cfg.scale), k, v, g, beta, recurrent_state)


class GateBeforeNorm(EmulatedLayer):
    """The silu(z) gate applied before the RMSNorm instead of after it."""

    def gated_norm(self, core, z):
        gated = f32(core) * lowp.silu(f32(z))
        return self.store(lowp.rms_normalize(gated, self.cfg.rms_norm_eps) * self.norm_weight())


def _recurrent(self, q, k, v, g, beta, S, *, decay_after_write=False, state_store=None):
    """The recurrent rule with a bug switch (float32, scale folded into q)."""
    qe, ke = self.expand(f32(q)) * F32(self.cfg.scale), self.expand(f32(k))
    v, g, beta = f32(v), f32(g), f32(beta)
    S = f32(S).copy()
    core = np.empty(v.shape, dtype=F32)
    decay = np.exp(g)
    for t in range(v.shape[1]):
        if not decay_after_write:
            S *= decay[:, t, :, None, None]
        m = np.einsum("bhk,bhkv->bhv", ke[:, t], S)
        S += ke[:, t, :, :, None] * (beta[:, t, :, None] * (v[:, t] - m))[:, :, None, :]
        if decay_after_write:
            S *= decay[:, t, :, None, None]
        if state_store is not None:
            S = state_store(S)
        core[:, t] = np.einsum("bhk,bhkv->bhv", qe[:, t], S)
    return self.store(core), S


class DecayAfterWrite(EmulatedLayer):
    """The state decays after the rank-1 write instead of before it (and m reads the undecayed state)."""

    def delta_rule(self, q, k, v, g, beta, recurrent_state):
        return _recurrent(self, q, k, v, g, beta, recurrent_state, decay_after_write=True)


class ConvStateShifted(EmulatedLayer):
    """The conv state keeps columns t-K .. t-1 instead of t-K+1 .. t (one slot stale)."""

    def conv1d(self, qkv, conv_state):
        qkv_conv, _ = super().conv1d(qkv, conv_state)
        K = self.cfg.conv_kernel
        full = np.concatenate([np.swapaxes(f32(conv_state), 1, 2), f32(qkv)], axis=1)
        return qkv_conv, np.ascontiguousarray(np.swapaxes(full[:, -K - 1:-1], 1, 2))


class QKVSplitOrder(EmulatedLayer):
    """The conv output split as [K | Q | V] instead of [Q | K | V]."""

    def split_qkv(self, qkv_conv):
        q, k, v = super().split_qkv(qkv_conv)
        return k, q, v


class StateTransposed(EmulatedLayer):
    """The recurrent state kept (and handed out) as [Hv, dv, dk] instead of [Hv, dk, dv]."""

    def new_state(self, batch: int = 1) -> EmulatedState:
        st = super().new_state(batch)
        st.recurrent_state = np.ascontiguousarray(np.swapaxes(st.recurrent_state, -1, -2))
        return st

    def delta_rule(self, q, k, v, g, beta, recurrent_state):
        core, S = super().delta_rule(q, k, v, g, beta, np.swapaxes(recurrent_state, -1, -2))
        return core, np.ascontiguousarray(np.swapaxes(S, -1, -2))


class SoftplusReplaced(EmulatedLayer):
    """g = -exp(A_log) * sigmoid(a + dt_bias): softplus swapped for sigmoid."""

    def gates(self, a, b):
        g = -np.exp(self.w["linear_attn.A_log"]) * lowp.sigmoid(f32(a) + self.w["linear_attn.dt_bias"])
        return g, super().gates(a, b)[1]


class SigmoidReplaced(EmulatedLayer):
    """beta = softplus(b): sigmoid swapped for softplus."""

    def gates(self, a, b):
        return super().gates(a, b)[0], self.store(lowp.softplus(f32(b)))


class SoftplusClamped(EmulatedLayer):
    """softplus(x) = log(1 + exp(min(x, 20))): saturates at 20 where the exact softplus returns x
    (metrale's CUDA gate epilogue, docs/math.md §5). Only the a + dt_bias > 20 case shows it."""

    def gates(self, a, b):
        x = f32(a) + self.w["linear_attn.dt_bias"]
        g = -np.exp(self.w["linear_attn.A_log"]) * lowp.softplus(np.minimum(x, F32(20.0)))
        return g, super().gates(a, b)[1]


class Bf16RecurrentState(EmulatedLayer):
    """The recurrent state stored in bf16 between tokens (vLLM's old Qwen3-Next default, an FP16
    DeltaNet state in TensorRT-Model-Connect#725)."""

    def delta_rule(self, q, k, v, g, beta, recurrent_state):
        def bf16(s):
            return lowp.store(s, "bf16")
        return _recurrent(self, q, k, v, g, beta, bf16(recurrent_state), state_store=bf16)


class InitialStateIgnored(EmulatedLayer):
    """The delta rule starts every call from a zero state (h0 not passed; HF-4.57's prefill)."""

    def delta_rule(self, q, k, v, g, beta, recurrent_state):
        return super().delta_rule(q, k, v, g, beta, np.zeros_like(recurrent_state))


class _AliasSnapshot:
    """A "snapshot" that holds the live state's arrays instead of copies."""

    def __init__(self, state: EmulatedState):
        self.conv_state, self.recurrent_state, self.seq_len = state.conv_state, state.recurrent_state, state.seq_len
        self.fingerprint, self.warned, self.schema_version = state.cfg.state_fingerprint(), state.warned, 1
        self.batch = state.batch

    def check_compatible(self, fingerprint, batch, where="restore"):
        return None

    def save(self, path):
        return state_snapshot(self).save(path)


def state_snapshot(snap):
    return Snapshot(snap.conv_state, snap.recurrent_state, snap.seq_len, snap.fingerprint, snap.warned)


class _AliasingState(EmulatedState):
    def snapshot(self):
        return _AliasSnapshot(self)


class SnapshotAliasesState(EmulatedLayer):
    """state.snapshot() returns references to the live arrays, which later calls update in place."""

    def new_state(self, batch: int = 1) -> EmulatedState:
        return _AliasingState(self.cfg, batch)


class NoResetOnMismatch(EmulatedLayer):
    """A call whose seq_pos differs from the state's seq_len continues from the old state."""

    def apply_seq_pos_rule(self, state, pos):
        return None


class PerHeadNormReadAsShared(EmulatedLayer):
    """A per_head gated-norm weight [Hv*dv] read as shared: every head uses the first dv elements."""

    def norm_weight(self):
        return self.w["linear_attn.norm.weight"][: self.cfg.head_v_dim]


@dataclass(frozen=True)
class Mutant:
    name: str
    cls: type
    stage: str  # the first stage verify must flag
    call: tuple[str, int] | None = None  # (case recipe prefix, call index) where it must first show
    bug_class: str = ""

    def factory(self, cfg, weights, *, profile: str = "f32", strict: bool = False, placement: str = "hf", **kw):
        layer = self.cls(cfg, weights, profile=profile, placement=placement, strict=strict, **kw)
        return emulated_adapter(layer, f"mutant {self.name} ({profile}, placement {placement})")


MUTANTS: tuple[Mutant, ...] = (
    Mutant("head_grouping_tiled", HeadGroupingTiled, "delta_rule", bug_class="head grouping tiled"),
    Mutant("norm_weight_plain", NormWeightPlain, "input_norm", bug_class="w instead of 1 + w"),
    Mutant("missing_l2_norm", MissingL2Norm, "qk_norm", bug_class="missing L2 norm"),
    Mutant("scale_doubled", ScaleDoubled, "delta_rule", bug_class="missing or doubled scale"),
    Mutant("gate_before_norm", GateBeforeNorm, "gated_norm", bug_class="gate applied before the norm"),
    Mutant("decay_after_write", DecayAfterWrite, "delta_rule", bug_class="decay after the write"),
    Mutant("conv_state_shifted", ConvStateShifted, "conv1d", ("prefill-decode_T65", 0),
           bug_class="conv state shifted by one slot"),
    Mutant("qkv_split_order", QKVSplitOrder, "qk_norm", bug_class="Q/K/V split order"),
    Mutant("state_transposed", StateTransposed, "delta_rule", bug_class="state transposed"),
    Mutant("softplus_replaced", SoftplusReplaced, "gates", bug_class="softplus replaced (by sigmoid)"),
    Mutant("sigmoid_replaced", SigmoidReplaced, "gates", bug_class="sigmoid replaced (by softplus)"),
    Mutant("bf16_recurrent_state", Bf16RecurrentState, "delta_rule", bug_class="bf16 recurrent state"),
    Mutant("initial_state_ignored", InitialStateIgnored, "delta_rule", ("prefill-decode_T65", 1),
           bug_class="initial state ignored on continuation"),
    Mutant("snapshot_aliases_state", SnapshotAliasesState, "conv1d", ("snapshot-replay", 3),
           bug_class="snapshot that aliases the live state"),
    Mutant("no_reset_on_mismatch", NoResetOnMismatch, "conv1d", ("restore-mismatch", 2),
           bug_class="no reset on seq-len mismatch"),
    Mutant("per_head_norm_read_as_shared", PerHeadNormReadAsShared, "gated_norm", ("per-head-norm", 0),
           bug_class="per_head norm weight read as shared"),
    Mutant("softplus_clamped_20", SoftplusClamped, "gates", ("gates-extreme", 0),
           bug_class="softplus saturating at 20 (metrale CUDA; extra)"),
)
MUTANT_BY_NAME = {m.name: m for m in MUTANTS}

# module-level factories, so that `gdncheck run gdncheck.conformance.meta.mutants:NAME` works
globals().update({m.name: m.factory for m in MUTANTS})
