"""The stage vocabulary of SPEC §2: one name per stage and per tensor, used unchanged everywhere.

``reference/`` and ``gpu_impl/`` name their stage functions after :data:`STAGES`; fixtures, result
records and report sections use the tensor names of :data:`STAGE_TENSORS` and :data:`STATE_TENSORS`.
Shapes are symbolic, per sequence, without the leading batch axis that every array carries.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[str, ...]  # symbols: T, D, I, Hk, Hv, dk, dv, conv_dim, K
    stage: str

    def concrete(self, dims: dict[str, int], tokens: int | None = None) -> tuple[int, ...]:
        out = []
        for sym in self.shape:
            out.append(tokens if sym == "T" else dims[sym])
        return tuple(out)

    @property
    def head_axis(self) -> int | None:
        """Axis (per sequence, without batch) that indexes heads, if the tensor has one."""
        for i, sym in enumerate(self.shape):
            if sym in ("Hk", "Hv"):
                return i
        return None


@dataclass(frozen=True)
class Stage:
    index: int
    name: str
    tensors: tuple[TensorSpec, ...]
    formula: str


def _stage(index: int, name: str, formula: str, *tensors: tuple[str, tuple[str, ...]]) -> Stage:
    return Stage(index, name, tuple(TensorSpec(t, s, name) for t, s in tensors), formula)


STAGES: tuple[Stage, ...] = (
    _stage(0, "input", "layer input (residual stream)", ("x", ("T", "D"))),
    _stage(1, "input_norm", "x / sqrt(mean(x^2) + eps) * (1 + w_in)", ("x_norm", ("T", "D"))),
    _stage(
        2,
        "in_proj",
        "x_norm @ W^T for W in (in_proj_qkv, in_proj_z, in_proj_a, in_proj_b)",
        ("qkv", ("T", "conv_dim")),
        ("z", ("T", "Hv", "dv")),
        ("a", ("T", "Hv")),
        ("b", ("T", "Hv")),
    ),
    _stage(3, "conv1d", "silu(causal depthwise conv over conv history + qkv)", ("qkv_conv", ("T", "conv_dim"))),
    _stage(
        4,
        "qk_norm",
        "split [Q|K|V]; q, k <- u / sqrt(sum(u^2) + 1e-6) per head (q unscaled)",
        ("q", ("T", "Hk", "dk")),
        ("k", ("T", "Hk", "dk")),
        ("v", ("T", "Hv", "dv")),
    ),
    _stage(
        5,
        "gates",
        "g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b)",
        ("g", ("T", "Hv")),
        ("beta", ("T", "Hv")),
    ),
    _stage(6, "delta_rule", "gated delta rule (SPEC §3)", ("core", ("T", "Hv", "dv"))),
    _stage(
        7,
        "gated_norm",
        "core / sqrt(mean_dv(core^2) + eps) * w_norm * silu(z)",
        ("core_gated", ("T", "Hv", "dv")),
    ),
    _stage(8, "out_proj", "core_gated @ out_proj^T", ("attn_out", ("T", "D"))),
    _stage(9, "residual", "x + attn_out", ("h", ("T", "D"))),
    _stage(10, "post_norm", "h / sqrt(mean(h^2) + eps) * (1 + w_post)", ("h_norm", ("T", "D"))),
    _stage(11, "mlp", "down(silu(gate(h_norm)) * up(h_norm))", ("mlp_out", ("T", "D"))),
    _stage(12, "output", "h + mlp_out", ("out", ("T", "D"))),
)

STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
STAGE_BY_NAME: dict[str, Stage] = {s.name: s for s in STAGES}

#: Every stage tensor in pipeline order (the trace of one call).
STAGE_TENSORS: tuple[TensorSpec, ...] = tuple(t for s in STAGES for t in s.tensors)
TENSOR_BY_NAME: dict[str, TensorSpec] = {t.name: t for t in STAGE_TENSORS}

#: The state a layer carries between calls (SPEC §4), per sequence.
STATE_TENSORS: tuple[TensorSpec, ...] = (
    TensorSpec("conv_state", ("conv_dim", "K"), "state"),
    TensorSpec("recurrent_state", ("Hv", "dk", "dv"), "state"),
)
STATE_BY_NAME: dict[str, TensorSpec] = {t.name: t for t in STATE_TENSORS}

#: Tensors a stage reads, by the names above (its golden inputs in stage-isolated mode).
STAGE_INPUTS: dict[str, tuple[str, ...]] = {
    "input": (),
    "input_norm": ("x",),
    "in_proj": ("x_norm",),
    "conv1d": ("qkv", "conv_state"),
    "qk_norm": ("qkv_conv",),
    "gates": ("a", "b"),
    "delta_rule": ("q", "k", "v", "g", "beta", "recurrent_state"),
    "gated_norm": ("core", "z"),
    "out_proj": ("core_gated",),
    "residual": ("x", "attn_out"),
    "post_norm": ("h",),
    "mlp": ("h_norm",),
    "output": ("h", "mlp_out"),
}


def stage_of(tensor: str) -> str:
    """The stage that produces ``tensor`` (a stage tensor or a state tensor)."""
    if tensor in TENSOR_BY_NAME:
        return TENSOR_BY_NAME[tensor].stage
    if tensor in STATE_BY_NAME:
        return "state"
    raise KeyError(f"{tensor!r} is not a stage or state tensor; known: {', '.join(all_tensor_names())}")


def all_tensor_names() -> tuple[str, ...]:
    return tuple(t.name for t in STAGE_TENSORS) + tuple(t.name for t in STATE_TENSORS)
