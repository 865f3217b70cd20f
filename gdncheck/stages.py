"""The stage vocabulary of docs/spec.md §2: one name per stage and per tensor, used unchanged everywhere.

``reference/`` and ``gpu_impl/`` name their stage functions after :data:`STAGES`; fixtures, result
records, report sections and the tolerance table use the tensor names of :data:`STAGE_TENSORS` and
:data:`STATE_TENSORS`. Shapes are symbolic, per sequence, without the leading batch axis that every
array carries.

Every tensor belongs to the stage that *produces* it (:func:`stage_of`), the two states included:
``conv_state`` to ``conv1d`` and ``recurrent_state`` to ``delta_rule`` (each reads the old state and
returns the new one), so a wrong state is localised to the stage that wrote it. The seq_len
bookkeeping is judged under the pseudo-stage :data:`STATE_STAGE`, after every stage.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[str, ...]  # symbols: T, D, I, Hk, Hv, dk, dv, conv_dim, K
    stage: str  # the stage that produces it

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
    tensors: tuple[TensorSpec, ...]  # what it adds to a call's trace, in its return order
    formula: str
    inputs: tuple[str, ...]  # the tensors it reads (its golden inputs in stage-isolated mode)
    states: tuple[TensorSpec, ...] = ()  # the state it reads and returns, after its tensors

    @property
    def outputs(self) -> tuple[str, ...]:
        """Everything the stage function returns, in its return order (state last)."""
        return tuple(t.name for t in self.tensors + self.states)


def _stage(index: int, name: str, formula: str, inputs: tuple[str, ...], *tensors: tuple[str, tuple[str, ...]],
           states: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> Stage:
    def specs(items):
        return tuple(TensorSpec(t, s, name) for t, s in items)

    return Stage(index, name, specs(tensors), formula, inputs, specs(states))


STAGES: tuple[Stage, ...] = (
    _stage(0, "input", "layer input (residual stream)", (), ("x", ("T", "D"))),
    _stage(1, "input_norm", "x / sqrt(mean(x^2) + eps) * (1 + w_in)", ("x",), ("x_norm", ("T", "D"))),
    _stage(
        2,
        "in_proj",
        "x_norm @ W^T for W in (in_proj_qkv, in_proj_z, in_proj_a, in_proj_b)",
        ("x_norm",),
        ("qkv", ("T", "conv_dim")),
        ("z", ("T", "Hv", "dv")),
        ("a", ("T", "Hv")),
        ("b", ("T", "Hv")),
    ),
    _stage(3, "conv1d", "silu(causal depthwise conv over conv history + qkv)", ("qkv", "conv_state"),
           ("qkv_conv", ("T", "conv_dim")), states=(("conv_state", ("conv_dim", "K")),)),
    _stage(
        4,
        "qk_norm",
        "split [Q|K|V]; q, k <- u / sqrt(sum(u^2) + 1e-6) per head (q unscaled)",
        ("qkv_conv",),
        ("q", ("T", "Hk", "dk")),
        ("k", ("T", "Hk", "dk")),
        ("v", ("T", "Hv", "dv")),
    ),
    _stage(
        5,
        "gates",
        "g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b)",
        ("a", "b"),
        ("g", ("T", "Hv")),
        ("beta", ("T", "Hv")),
    ),
    _stage(6, "delta_rule", "gated delta rule (docs/spec.md §3)", ("q", "k", "v", "g", "beta", "recurrent_state"),
           ("core", ("T", "Hv", "dv")), states=(("recurrent_state", ("Hv", "dk", "dv")),)),
    _stage(7, "gated_norm", "core / sqrt(mean_dv(core^2) + eps) * w_norm * silu(z)", ("core", "z"),
           ("core_gated", ("T", "Hv", "dv"))),
    _stage(8, "out_proj", "core_gated @ out_proj^T", ("core_gated",), ("attn_out", ("T", "D"))),
    _stage(9, "residual", "x + attn_out", ("x", "attn_out"), ("h", ("T", "D"))),
    _stage(10, "post_norm", "h / sqrt(mean(h^2) + eps) * (1 + w_post)", ("h",), ("h_norm", ("T", "D"))),
    _stage(11, "mlp", "down(silu(gate(h_norm)) * up(h_norm))", ("h_norm",), ("mlp_out", ("T", "D"))),
    _stage(12, "output", "h + mlp_out", ("h", "mlp_out"), ("out", ("T", "D"))),
)

STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)

#: Every stage tensor in pipeline order (the trace of one call).
STAGE_TENSORS: tuple[TensorSpec, ...] = tuple(t for s in STAGES for t in s.tensors)
TENSOR_BY_NAME: dict[str, TensorSpec] = {t.name: t for t in STAGE_TENSORS}

#: The state a layer carries between calls (docs/spec.md §4), per sequence, in pipeline order.
STATE_TENSORS: tuple[TensorSpec, ...] = tuple(t for s in STAGES for t in s.states)
STATE_NAMES: tuple[str, ...] = tuple(t.name for t in STATE_TENSORS)

#: stage -> the tensors it reads (its golden inputs in stage-isolated mode).
STAGE_INPUTS: dict[str, tuple[str, ...]] = {s.name: s.inputs for s in STAGES}

#: stage -> the tensors it returns, in its return order (state last).
STAGE_OUTPUTS: dict[str, tuple[str, ...]] = {s.name: s.outputs for s in STAGES}

#: Every tensor a call produces, in pipeline order (the order first divergences are searched in).
TENSOR_ORDER: tuple[str, ...] = tuple(n for s in STAGES for n in s.outputs)

#: A port must write these for every call; the other stage tensors are optional ("missing").
REQUIRED_OUTPUTS: tuple[str, ...] = ("out",) + STATE_NAMES

#: The pseudo-stage of the seq_len bookkeeping records; they sort after every stage.
STATE_STAGE = "state"
STATE_STAGE_INDEX = len(STAGES)

_PRODUCER: dict[str, str] = {t.name: t.stage for t in STAGE_TENSORS + STATE_TENSORS}


def stage_of(tensor: str) -> str:
    """The stage that produces ``tensor`` (a stage tensor or a state tensor)."""
    try:
        return _PRODUCER[tensor]
    except KeyError:
        raise KeyError(f"{tensor!r} is not a stage or state tensor; known: {', '.join(TENSOR_ORDER)}") from None


def stage_index(stage: str) -> int:
    """Position of ``stage`` in the pipeline; :data:`STATE_STAGE` after every stage."""
    return STATE_STAGE_INDEX if stage == STATE_STAGE else STAGE_NAMES.index(stage)


def tensor_rank(tensor: str) -> int:
    """Position of ``tensor`` in :data:`TENSOR_ORDER` (unknown names last)."""
    return TENSOR_ORDER.index(tensor) if tensor in TENSOR_ORDER else len(TENSOR_ORDER)
