"""Mutant implementations: the correct emulated layer
(:class:`~gdncheck.conformance.earn.emulate.EmulatedLayer`) with one known bug each (docs/spec.md §6;
where each bug class comes from: docs/math.md §5).

Each mutant overrides one method. ``MUTANTS`` names each with the stage where ``verify`` must first
see it, where the bug only shows on a later call the case and call where it must first show, the
edge case built to expose it (fixtures/cases.py ``EDGES``), and whether it is harmless in realistic
regimes (``edge_only``: it must pass every realistic case and fail its edge case).
Every mutant is also a plug-in factory::

    gdncheck run gdncheck.conformance.meta.mutants:head_grouping_tiled --profile bf16 --out out/
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gdncheck.conformance.earn import lowp
from gdncheck.conformance.earn.emulate import EmulatedLayer, EmulatedState, emulated_adapter
from gdncheck.conformance.earn.lowp import F32, f32
from gdncheck.fixtures.cases import CHECKPOINT_DTYPES, EDGES, REALISTIC
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


def _recurrent(self, q, k, v, g, beta, S, *, decay_after_write=False, state_store=None, decay_of=np.exp):
    """The recurrent rule with a bug switch (float32, scale folded into q): the decay after the write,
    a state rounded (or clamped) after every token, another decay factor than exp(g)."""
    qe, ke = self.expand(f32(q)) * F32(self.cfg.scale), self.expand(f32(k))
    v, g, beta = f32(v), f32(g), f32(beta)
    S = f32(S).copy()
    core = np.empty(v.shape, dtype=F32)
    with np.errstate(under="ignore"):
        decay = f32(decay_of(g))
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


class BetaClamped15(EmulatedLayer):
    """b clamped to [-15, 15] before the sigmoid (doppler's CPU reference of the layer): beta 3.1e-7
    where it is 1.8e-10 at b = -22."""

    def sigmoid(self, b):
        return lowp.sigmoid(np.clip(f32(b), F32(-15.0), F32(15.0)))


class L2NormEpsMax(EmulatedLayer):
    """q, k = x / max(||x||, 1e-6) (ggml's l2_norm, llama.cpp) where the contract has
    x / sqrt(sum x^2 + 1e-6): the same below f32 rounding unless sum x^2 is comparable to 1e-6."""

    def l2_normalize(self, x):
        n = np.sqrt(lowp.sum_last(f32(x) * f32(x), self.order))
        return f32(x) / np.maximum(n, F32(1e-6))


class L2NormEpsOutsideSqrt(EmulatedLayer):
    """q, k = x / (sqrt(sum x^2) + 1e-6): the eps outside the square root."""

    def l2_normalize(self, x):
        return f32(x) / (np.sqrt(lowp.sum_last(f32(x) * f32(x), self.order)) + F32(1e-6))


class RmsNormEpsOutsideSqrt(EmulatedLayer):
    """The layer RMSNorms as x / (sqrt(mean x^2) + eps): the eps outside the square root."""

    def rms_normalize(self, x):
        x = f32(x)
        return x / (np.sqrt(lowp.sum_last(x * x, self.order) / F32(x.shape[-1])) + F32(self.cfg.rms_norm_eps))


class GatedNormEpsOutsideSqrt(EmulatedLayer):
    """The gated RMSNorm as core / (sqrt(mean core^2) + eps): the eps outside the square root."""

    def gated_normalize(self, core):
        c = f32(core)
        return c / (np.sqrt(lowp.sum_last(c * c, self.order) / F32(c.shape[-1])) + F32(self.cfg.rms_norm_eps))


class GatedNormWeightOnePlus(EmulatedLayer):
    """The gated RMSNorm's weight applied as 1 + w, like the layer norms' (it is plain w)."""

    def norm_weight(self):
        return F32(1.0) + super().norm_weight()


class SoftplusNaive(EmulatedLayer):
    """softplus(x) = log(1 + exp(x)) in float32 (x itself above 20; ggml's, llama.cpp): 0 for x below
    about -17 where the exact one is e^x, and inexact below about -5."""

    def softplus(self, x):
        with np.errstate(over="ignore"):
            sp = np.log(F32(1.0) + np.exp(f32(x)))
        return np.where(x > 20.0, f32(x), sp)


class GateF16(EmulatedLayer):
    """g computed in float16, every operation rounded to f16 (a model loaded in fp16 without
    transformers' ``A_log.float()``): A = exp(A_log) overflows to inf above 65504."""

    def gates(self, a, b):
        def h(t):
            return lowp.store(t, "f16")
        with np.errstate(over="ignore", invalid="ignore"):
            A = h(np.exp(h(self.w["linear_attn.A_log"])))
            x = h(h(a) + h(self.w["linear_attn.dt_bias"]))
            g = h(-A * h(self.softplus(x)))
        return g, super().gates(a, b)[1]


class DecayClamped(EmulatedLayer):
    """The per-token decay exp(g) clamped to [1e-6, 1 - 1e-6] (metrale's decode kernels): a full
    forget keeps 1e-6 of the state, a decay of 1 loses 1e-6 per token."""

    def delta_rule(self, q, k, v, g, beta, recurrent_state):
        def clamped(gg):
            return np.clip(np.exp(gg), F32(1e-6), F32(1.0 - 1e-6))
        return _recurrent(self, q, k, v, g, beta, recurrent_state, decay_of=clamped)


class F16RecurrentState(EmulatedLayer):
    """The recurrent state stored in f16 between tokens (an FP16 DeltaNet state,
    TensorRT-Model-Connect#725): values below 6e-8 flush to 0, above 65504 overflow."""

    def delta_rule(self, q, k, v, g, beta, recurrent_state):
        def f16(s):
            with np.errstate(over="ignore"):
                return lowp.store(s, "f16")
        return _recurrent(self, q, k, v, g, beta, f16(recurrent_state), state_store=f16)


class StateNormClamp1000(EmulatedLayer):
    """Each head's state rescaled to Frobenius norm 1000 when it exceeds it (metrale's Metal kernel)."""

    def delta_rule(self, q, k, v, g, beta, recurrent_state):
        def clamp(S):
            n = np.sqrt(np.sum(S * S, axis=(-2, -1), keepdims=True, dtype=F32))
            return np.where(n > 1000.0, S * (F32(1000.0) / np.maximum(n, F32(1.0))), S).astype(F32)
        return _recurrent(self, q, k, v, g, beta, recurrent_state, state_store=clamp)


class DecayQuotientOfExps(EmulatedLayer):
    """The chunked rule's decay between positions as exp(γ_i) / exp(γ_j) instead of exp(γ_i − γ_j):
    0/0 where a chunk's cumulative decay underflows (fast-forgetting heads)."""

    def delta_rule(self, q, k, v, g, beta, recurrent_state):
        if v.shape[1] == 1:
            return super().delta_rule(q, k, v, g, beta, recurrent_state)
        core, S = lowp.delta_rule_chunked_f32(
            self.expand(f32(q)), self.expand(f32(k)), f32(v), f32(g), f32(beta), recurrent_state, self.cfg.scale,
            chunk_size=self.chunk_size, scale_at=self.p.scale_at, order=self.order, quotient_of_exps=True)
        return self.store(core), S


def tiled_order(num_k_heads: int, num_v_heads: int) -> np.ndarray:
    """Position p of the tiled head order holds canonical (interleaved) value head ``order[p]``:
    value head j = kh·r + i sits at i·Hk + kh."""
    r = num_v_heads // num_k_heads
    return np.array([(p % num_k_heads) * r + p // num_k_heads for p in range(num_v_heads)])


class StateHeadsTiled(EmulatedLayer):
    """The recurrent state handed out (and read back) with its value heads in the tiled order
    (kh + Hk·i) instead of the canonical interleaved one (kh·r + i)."""

    def delta_rule(self, q, k, v, g, beta, recurrent_state):
        order = tiled_order(self.cfg.num_k_heads, self.cfg.num_v_heads)
        canonical = np.empty_like(recurrent_state)
        canonical[:, order] = recurrent_state
        core, S = super().delta_rule(q, k, v, g, beta, canonical)
        return core, np.ascontiguousarray(S[:, order])


class ConvWindowShifted(EmulatedLayer):
    """The conv's window ends one token early (columns t-K .. t-1): qkv_conv is the correct one of
    the previous token."""

    def conv1d(self, qkv, conv_state):
        w = self.w["linear_attn.conv1d.weight"]
        K, T = w.shape[1], qkv.shape[1]
        full = np.concatenate([np.swapaxes(f32(conv_state), 1, 2), f32(qkv)], axis=1)
        y = np.zeros(qkv.shape, dtype=F32)
        for j in range(K):
            y += w[:, j] * full[:, j: j + T]
        if self.p.conv_two_roundings:
            y = self.store(y)
        return self.store(lowp.silu(y)), np.ascontiguousarray(self.store(np.swapaxes(full[:, -K:], 1, 2)))


# --- the bug classes real engines have shipped (issue 36 item 5): one mutant each ------------------
class L2NormEpsClampSum(EmulatedLayer):
    """q, k = x / sqrt(max(sum x^2, 1e-6)): the eps a floor under the squared sum (a clamp) instead
    of a term added to it; the same unless sum x^2 is comparable to 1e-6."""

    def l2_normalize(self, x):
        return f32(x) / np.sqrt(np.maximum(lowp.sum_last(f32(x) * f32(x), self.order), F32(1e-6)))


class QKNormRmsForm(EmulatedLayer):
    """q, k normalised as an RMSNorm, x / sqrt(mean x^2 + 1e-6), instead of the L2 norm (sum): every
    q and k sqrt(dk) times too large (the norm's form taken from the layer's other norms)."""

    def l2_normalize(self, x):
        return lowp.rms_normalize(f32(x), 1e-6, self.order)


class StateBf16WriteBack(EmulatedLayer):
    """The recurrent state exact within a call but written back to the cache in bf16 at its end (a
    bf16 state cache: one rounding per call, not per token)."""

    def delta_rule(self, q, k, v, g, beta, recurrent_state):
        core, S = super().delta_rule(q, k, v, g, beta, recurrent_state)
        return core, lowp.store(S, "bf16")


class StateReadTransposed(EmulatedLayer):
    """The kernel reads the cached state's buffer as V-major [Hv, dv, dk] while the cache holds it
    K-major [Hv, dk, dv] (a prefill kernel writing one layout, a decode kernel reading the other)."""

    def delta_rule(self, q, k, v, g, beta, recurrent_state):
        B, H, dk, dv = recurrent_state.shape
        read = np.ascontiguousarray(recurrent_state).reshape(B, H, dv, dk).swapaxes(-1, -2)
        return super().delta_rule(q, k, v, g, beta, np.ascontiguousarray(read))


class StaleConvStateOnReset(EmulatedLayer):
    """A row the seq-len rule resets (a new request in a used row) gets a zero recurrent state and
    seq_len but keeps the old request's conv window (vLLM's has_initial_state applied to the
    recurrent state only)."""

    def apply_seq_pos_rule(self, state, pos):
        conv = state.conv_state.copy()
        super().apply_seq_pos_rule(state, pos)
        state.conv_state[...] = conv


class OutputGateSigmoid(EmulatedLayer):
    """The output gate as sigmoid(z) instead of silu(z) (the full-attention layers' gate of Qwen3-Next
    taken for the linear-attention one)."""

    def output_gate(self, z):
        return lowp.sigmoid(f32(z))


class OutputGateMissingSilu(EmulatedLayer):
    """The output gate applied as z itself: the SiLU of silu(z) forgotten."""

    def output_gate(self, z):
        return f32(z)


class ConvMissingSilu(EmulatedLayer):
    """The causal conv's output without its SiLU (activation=None passed to the conv kernel)."""

    def conv1d(self, qkv, conv_state):
        w = self.w["linear_attn.conv1d.weight"]
        K, T = w.shape[1], qkv.shape[1]
        full = np.concatenate([np.swapaxes(f32(conv_state), 1, 2), f32(qkv)], axis=1)
        y = np.zeros(qkv.shape, dtype=F32)
        for j in range(K):
            y += w[:, j] * full[:, 1 + j: 1 + j + T]
        return self.store(y), np.ascontiguousarray(self.store(np.swapaxes(full[:, -K:], 1, 2)))


class ALogSign(EmulatedLayer):
    """g = +exp(A_log) * softplus(a + dt_bias): the loader's A = -exp(A_log) lost its sign (every
    decay above 1)."""

    def gates(self, a, b):
        g = np.exp(self.w["linear_attn.A_log"]) * self.softplus(f32(a) + self.w["linear_attn.dt_bias"])
        return g, super().gates(a, b)[1]


class ALogConvertedTwice(EmulatedLayer):
    """The loader stores A = -exp(A_log) and the kernel applies -exp again: g = -exp(-exp(A_log)) *
    softplus(a + dt_bias) (the checkpoint's A_log converted twice)."""

    def gates(self, a, b):
        A = -np.exp(self.w["linear_attn.A_log"])
        g = -np.exp(A) * self.softplus(f32(a) + self.w["linear_attn.dt_bias"])
        return g, super().gates(a, b)[1]


class ChunkMaskedExp(EmulatedLayer):
    """The chunked rule takes exp(γ_i − γ_j) over the whole chunk and masks by multiplying with the
    causal mask: inf · 0 = NaN where a chunk decays by more than e^88 (fast-forgetting heads)."""

    def delta_rule(self, q, k, v, g, beta, recurrent_state):
        if v.shape[1] == 1:
            return super().delta_rule(q, k, v, g, beta, recurrent_state)
        core, S = lowp.delta_rule_chunked_f32(
            self.expand(f32(q)), self.expand(f32(k)), f32(v), f32(g), f32(beta), recurrent_state, self.cfg.scale,
            chunk_size=self.chunk_size, scale_at=self.p.scale_at, order=self.order, mask_by_product=True)
        return self.store(core), S


class ConverterABHeadsTiled(EmulatedLayer):
    """A converter reordered the value heads of in_proj_a and in_proj_b to the tiled order (kh + Hk·i,
    for a broadcasting kernel) and left A_log, dt_bias and the other projections interleaved."""

    def in_proj(self, x_norm):
        qkv, z, a, b = super().in_proj(x_norm)
        order = tiled_order(self.cfg.num_k_heads, self.cfg.num_v_heads)
        return qkv, z, np.ascontiguousarray(a[..., order]), np.ascontiguousarray(b[..., order])


class GatesHeadMajorWhenMha(EmulatedLayer):
    """The Hv = Hk path (no head grouping) reads g and beta as head-major [H, T] buffers while they
    are token-major [T, H]: right only with one head or one token."""

    def delta_rule(self, q, k, v, g, beta, recurrent_state):
        if self.cfg.num_v_heads == self.cfg.num_k_heads:
            B, T, H = np.shape(g)
            g = np.ascontiguousarray(f32(g)).reshape(B, H, T).swapaxes(1, 2)
            beta = np.ascontiguousarray(f32(beta)).reshape(B, H, T).swapaxes(1, 2)
        return super().delta_rule(q, k, v, g, beta, recurrent_state)


class RoundedAtLoad(EmulatedLayer):
    """A float32 checkpoint weight held in a half dtype: rounded once at load (the model dtype given to
    every parameter), then used as the layer uses it. Subclasses name the weight and the dtype."""

    rounded: tuple[str, str] = ("", "")  # (weight, "bf16" | "f16")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        name, dtype = self.rounded
        self.w[name] = lowp.store(self.w[name], dtype)


class ALogBf16AtLoad(RoundedAtLoad):
    """A_log rounded to bf16 at load (SGLang PR 20741: A_log inherited --dtype bfloat16; transformers
    5.24's from_pretrained(dtype=bfloat16), whose Qwen3.5 classes keep nothing in float32)."""

    rounded = ("linear_attn.A_log", "bf16")


class ALogF16AtLoad(RoundedAtLoad):
    """A_log rounded to f16 at load (a model loaded in float16)."""

    rounded = ("linear_attn.A_log", "f16")


class GatedNormWeightBf16AtLoad(RoundedAtLoad):
    """The gated norm's weight rounded to bf16 at load (SGLang's RMSNormGated takes the default dtype)."""

    rounded = ("linear_attn.norm.weight", "bf16")


class GatedNormWeightF16AtLoad(RoundedAtLoad):
    """The gated norm's weight rounded to f16 at load."""

    rounded = ("linear_attn.norm.weight", "f16")


@dataclass(frozen=True)
class Mutant:
    name: str
    cls: type
    stage: str  # the first stage verify must flag
    call: tuple[str, int] | None = None  # (case recipe prefix, call index) where it must first show
    bug_class: str = ""
    edge: str | None = None  # the edge case built to expose it (a key of fixtures.cases.EDGES), if any
    edge_only: bool = False  # harmless in realistic regimes: passes every realistic case, fails its edge

    def factory(self, cfg, weights, *, profile: str = "f32", strict: bool = False, placement: str = "hf", **kw):
        layer = self.cls(cfg, weights, profile=profile, placement=placement, strict=strict, **kw)
        return emulated_adapter(layer, f"mutant {self.name} ({profile}, placement {placement})")

    @property
    def regime(self) -> str:
        return EDGES[self.edge] if self.edge else REALISTIC


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
    Mutant("softplus_clamped_20", SoftplusClamped, "gates", ("softplus-edges", 0),
           bug_class="softplus saturating at 20 (metrale CUDA)", edge="softplus", edge_only=True),
    Mutant("beta_clamped_15", BetaClamped15, "gates", ("sigmoid-edges", 0),
           bug_class="b clamped to ±15 before the sigmoid (doppler)", edge="sigmoid", edge_only=True),
    Mutant("l2norm_eps_max", L2NormEpsMax, "qk_norm", ("qk-eps", 0),
           bug_class="L2 norm as x / max(‖x‖, eps) (llama.cpp)", edge="qk-eps", edge_only=True),
    Mutant("l2norm_eps_outside_sqrt", L2NormEpsOutsideSqrt, "qk_norm", ("qk-eps", 0),
           bug_class="L2-norm eps outside the square root", edge="qk-eps", edge_only=True),
    Mutant("rmsnorm_eps_outside_sqrt", RmsNormEpsOutsideSqrt, "input_norm", ("rmsnorm-eps", 0),
           bug_class="RMSNorm eps outside the square root", edge="rmsnorm-eps", edge_only=True),
    Mutant("gated_norm_eps_outside_sqrt", GatedNormEpsOutsideSqrt, "gated_norm", ("gated-eps", 0),
           bug_class="gated-norm eps outside the square root", edge="gated-eps", edge_only=True),
    Mutant("gated_norm_weight_one_plus", GatedNormWeightOnePlus, "gated_norm",
           bug_class="gated-norm weight applied as (1 + w)"),
    Mutant("softplus_naive", SoftplusNaive, "gates", ("softplus-edges", 0),
           bug_class="softplus as log(1 + exp(x)) in f32 (llama.cpp)", edge="softplus", edge_only=True),
    Mutant("gate_f16", GateF16, "gates", bug_class="g computed in float16", edge="softplus"),
    Mutant("decay_clamped", DecayClamped, "delta_rule", ("sigmoid-edges", 2),
           bug_class="decay clamped to [1e-6, 1 − 1e-6] (metrale decode)", edge="sigmoid", edge_only=True),
    Mutant("f16_recurrent_state", F16RecurrentState, "delta_rule", bug_class="f16 recurrent state",
           edge="f16-state"),
    Mutant("state_norm_clamp_1000", StateNormClamp1000, "delta_rule", ("state-norms", 0),
           bug_class="state norm clamped at 1000 (metrale Metal)", edge="state-norms", edge_only=True),
    Mutant("decay_quotient_of_exps", DecayQuotientOfExps, "delta_rule",
           bug_class="chunk decay as exp(γi) / exp(γj)"),
    Mutant("state_heads_tiled", StateHeadsTiled, "delta_rule", bug_class="state's value heads in tiled order"),
    Mutant("conv_window_shifted", ConvWindowShifted, "conv1d", bug_class="conv window one token early"),
    # the bug classes real engines have shipped (issue 36 item 5)
    Mutant("l2norm_eps_clamp_sum", L2NormEpsClampSum, "qk_norm", ("qk-eps", 0),
           bug_class="L2 norm as x / sqrt(max(Σx², eps)) (eps a clamp)", edge="qk-eps", edge_only=True),
    Mutant("qk_norm_rms_form", QKNormRmsForm, "qk_norm", bug_class="q/k norm as an RMSNorm (mean, not sum)"),
    Mutant("state_bf16_write_back", StateBf16WriteBack, "delta_rule",
           bug_class="recurrent state written back in bf16 each call"),
    Mutant("state_read_transposed", StateReadTransposed, "delta_rule", ("prefill-decode_T65", 1),
           bug_class="cached state read V-major ([dv, dk]) while written K-major"),
    Mutant("stale_conv_state_on_reset", StaleConvStateOnReset, "conv1d", ("restore-mismatch", 2),
           bug_class="stale conv state on a new request (state handling)"),
    Mutant("output_gate_sigmoid", OutputGateSigmoid, "gated_norm", bug_class="output gate sigmoid(z), not silu(z)"),
    Mutant("output_gate_missing_silu", OutputGateMissingSilu, "gated_norm",
           bug_class="output gate without its SiLU (z, not silu(z))"),
    Mutant("conv_missing_silu", ConvMissingSilu, "conv1d", bug_class="conv output without its SiLU"),
    Mutant("a_log_sign", ALogSign, "gates", bug_class="A = +exp(A_log): the decay's sign lost"),
    Mutant("a_log_converted_twice", ALogConvertedTwice, "gates",
           bug_class="A_log converted twice (g = -exp(-exp(A_log)) softplus)"),
    Mutant("chunk_masked_exp", ChunkMaskedExp, "delta_rule",
           bug_class="chunk decay exp'd before the causal mask (inf · 0)"),
    Mutant("converter_ab_heads_tiled", ConverterABHeadsTiled, "in_proj",
           bug_class="a/b value heads in tiled order from a converter"),
    Mutant("gates_head_major_when_mha", GatesHeadMajorWhenMha, "delta_rule",
           bug_class="g, beta read head-major on the Hv = Hk path"),
)
@dataclass(frozen=True)
class TaggedMutant(Mutant):
    """A :class:`Mutant` shown only by the cases with ``case_tags`` (the kill matrix and the diagnosis
    run it on those alone)."""

    case_tags: tuple[str, ...] = ()


#: The float32 checkpoint weights rounded at load (issue 44): shown only by the cases whose A_log and
#: gated-norm weight are float32 values a half dtype does not hold (tag ``checkpoint-dtypes``); every other
#: case stores them bf16/f16-exact, so the rounding changes nothing there. Their kill cells, by profile, are
#: docs/meta.md's "Weights as the checkpoints hold them".
CHECKPOINT_DTYPE_MUTANTS: tuple[TaggedMutant, ...] = tuple(
    TaggedMutant(name, cls, stage, ("f32-weights", 0), bug_class=bug_class, case_tags=(CHECKPOINT_DTYPES,))
    for name, cls, stage, bug_class in (
        ("a_log_bf16_at_load", ALogBf16AtLoad, "gates", "A_log rounded to bf16 at load"),
        ("a_log_f16_at_load", ALogF16AtLoad, "gates", "A_log rounded to f16 at load"),
        ("gated_norm_weight_bf16_at_load", GatedNormWeightBf16AtLoad, "gated_norm",
         "gated-norm weight rounded to bf16 at load"),
        ("gated_norm_weight_f16_at_load", GatedNormWeightF16AtLoad, "gated_norm",
         "gated-norm weight rounded to f16 at load"),
    )
)
MUTANT_BY_NAME = {m.name: m for m in MUTANTS + CHECKPOINT_DTYPE_MUTANTS}

# module-level factories, so that `gdncheck run gdncheck.conformance.meta.mutants:NAME` works
globals().update({m.name: m.factory for m in MUTANTS + CHECKPOINT_DTYPE_MUTANTS})
