"""The stage vocabulary of docs/spec.md §2: one name per stage and per tensor, used unchanged everywhere.

``reference/`` and ``gpu_impl/`` name their stage functions after :data:`STAGES`; fixtures, result
records, report sections and the tolerance table use the tensor names of :data:`STAGE_TENSORS` and
:data:`STATE_TENSORS`. Shapes are symbolic, per sequence, without the leading batch axis that every
array carries.

Every tensor belongs to the stage that *produces* it (:func:`stage_of`), the two states included:
``conv_state`` to ``conv1d`` and ``recurrent_state`` to ``delta_rule`` (each reads the old state and
returns the new one), so a wrong state is localised to the stage that wrote it. The seq_len
bookkeeping is judged under the pseudo-stage :data:`STATE_STAGE`, after every stage.

Two layer kinds share the vocabulary (``GDNConfig.mlp_kind``): a ``dense`` layer, whose pipeline is
:data:`STAGES` and whose names (:data:`STAGE_TENSORS`, :data:`TENSOR_ORDER`, ...) are what every
dense fixture, record and summary holds; and a ``moe`` layer (Qwen3.5-MoE, Qwen3-Next: docs/moe.md),
whose pipeline has the sparse block's stages between ``post_norm`` and ``mlp``. The functions that
take a ``mlp_kind`` (:func:`layer_stages`, :func:`stage_inputs`, :func:`layer_tensor_order`, ...)
answer for either; with ``"dense"`` they return the dense tables themselves. :func:`stage_of`,
:func:`stage_index`, :func:`stage_rank` and :func:`tensor_rank` know both kinds' names at once.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[str, ...]  # symbols: T, D, I, Hk, Hv, dk, dv, conv_dim, K (MoE: E, top_k)
    stage: str  # the stage that produces it
    kind: str = "float"  # "float": judged by an error bound; "index": integers, judged exactly

    @property
    def is_index(self) -> bool:
        """Integers (expert indices): equal or not, never an error size (:data:`INDEX_TENSORS`)."""
        return self.kind == "index"

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
    function: str = ""  # the stage function's name where it is not the stage's own (:attr:`function_name`)

    @property
    def function_name(self) -> str:
        """The name of the function (reference/, gpu_impl/) or method (the emulated layer) that runs
        the stage: the stage's name, except the sparse layer's ``mlp``, run by ``moe_sum``."""
        return self.function or self.name

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
        raise KeyError(f"{tensor!r} is not a stage or state tensor; known: {', '.join(_RANKED)}") from None


def stage_index(stage: str) -> int:
    """Index of ``stage`` in docs/spec.md §2 (its position in the dense pipeline; the sparse block's
    stages are parts of stage 11); :data:`STATE_STAGE` after every stage."""
    if stage == STATE_STAGE:
        return STATE_STAGE_INDEX
    try:
        return _STAGE_INDEX[stage]
    except KeyError:
        raise ValueError(f"{stage!r} is not a stage; known: {', '.join(PIPELINE_ORDER)}") from None


def tensor_rank(tensor: str) -> int:
    """Position of ``tensor`` in the pipeline order of either layer kind (unknown names last): the
    dense tensors keep their order of :data:`TENSOR_ORDER`, the block's sit between ``h_norm`` and
    ``mlp_out``. A sort key, never written anywhere."""
    return _RANKED.index(tensor) if tensor in _RANKED else len(_RANKED)


# --- The sparse mixture-of-experts MLP block (Qwen3.5-MoE, Qwen3-Next; docs/moe.md) ---------------
# It adds names and leaves the dense pipeline above as it is. In a layer with the sparse block
# (``mlp_kind == "moe"``), these stages run between ``post_norm`` and ``mlp``, and stage ``mlp``
# (tensor ``mlp_out``) is their sum, ``mlp_out = experts_out + shared_out`` (:data:`MOE_MLP_STAGE`,
# function ``moe_sum``). Symbols: E num_experts, top_k num_experts_per_tok. ``selected_experts``
# holds expert indices (integers, judged exactly). Every stage of the block has index 11: they are
# the parts of docs/spec.md §2's stage 11; :func:`stage_rank` and :func:`tensor_rank` order them.

MOE_STAGES: tuple[Stage, ...] = (
    Stage(11, "router", (TensorSpec("router_logits", ("T", "E"), "router"),), "h_norm @ W_router^T", ("h_norm",)),
    Stage(
        11,
        "routing",
        (TensorSpec("routing_weights", ("T", "top_k"), "routing"),
         TensorSpec("selected_experts", ("T", "top_k"), "routing", kind="index")),
        "p = softmax(router_logits); selected_experts = the top_k experts by p, descending, exact ties "
        "to the lower index in the goldens (any tied expert is a port's convention); routing_weights = "
        "p[selected] / sum(p[selected]) (norm_topk_prob) or p[selected]",
        ("router_logits",),
    ),
    Stage(
        11,
        "experts",
        (TensorSpec("experts_out", ("T", "D"), "experts"),),
        "sum_j routing_weights[j] * down_e(silu(gate_e(h_norm)) * up_e(h_norm)), e = selected_experts[j]",
        ("h_norm", "routing_weights", "selected_experts"),
    ),
    Stage(
        11,
        "shared_expert",
        (TensorSpec("shared_out", ("T", "D"), "shared_expert"),),
        "sigmoid(h_norm @ w_shared_gate^T) * down_s(silu(gate_s(h_norm)) * up_s(h_norm))",
        ("h_norm",),
    ),
)

MOE_STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in MOE_STAGES)
MOE_TENSORS: tuple[TensorSpec, ...] = tuple(t for s in MOE_STAGES for t in s.tensors)
MOE_TENSOR_BY_NAME: dict[str, TensorSpec] = {t.name: t for t in MOE_TENSORS}

#: Tensors each sparse-block stage reads.
MOE_STAGE_INPUTS: dict[str, tuple[str, ...]] = {s.name: s.inputs for s in MOE_STAGES}
#: What stage ``mlp`` reads in a layer with the sparse block (its formula: experts_out + shared_out).
MOE_MLP_INPUTS: tuple[str, ...] = ("experts_out", "shared_out")
#: Stage ``mlp`` of a sparse layer: the same stage and tensor as the dense one, another formula and
#: other inputs, run by the function ``moe_sum``.
MOE_MLP_STAGE = Stage(11, "mlp", (TensorSpec("mlp_out", ("T", "D"), "mlp"),), "experts_out + shared_out",
                      MOE_MLP_INPUTS, function="moe_sum")
#: Integer tensors of the block (compared exactly, never by a floating-point error).
MOE_INDEX_TENSORS: tuple[str, ...] = tuple(t.name for t in MOE_TENSORS if t.is_index)
#: Every integer stage tensor of either layer kind.
INDEX_TENSORS: tuple[str, ...] = MOE_INDEX_TENSORS

# --- per layer kind --------------------------------------------------------------------------------
#: The layer kinds (gdncheck.config.MLP_KINDS): the dense SwiGLU MLP or the sparse block.
LAYER_KINDS: tuple[str, ...] = ("dense", "moe")

_MOE_PIPELINE: tuple[Stage, ...] = (*STAGES[:11], *MOE_STAGES, MOE_MLP_STAGE, *STAGES[12:])


def _kind(mlp_kind: str) -> str:
    if mlp_kind not in LAYER_KINDS:
        raise ValueError(f"mlp_kind must be one of {', '.join(LAYER_KINDS)}, found {mlp_kind!r}")
    return mlp_kind


def layer_stages(mlp_kind: str = "dense") -> tuple[Stage, ...]:
    """The pipeline of a layer of that kind, in order: :data:`STAGES` itself for ``dense``; for
    ``moe`` the same with the block's stages after ``post_norm`` and :data:`MOE_MLP_STAGE` as ``mlp``."""
    return STAGES if _kind(mlp_kind) == "dense" else _MOE_PIPELINE


def layer_stage_names(mlp_kind: str = "dense") -> tuple[str, ...]:
    """Stage names in pipeline order (:data:`STAGE_NAMES` for ``dense``)."""
    return STAGE_NAMES if _kind(mlp_kind) == "dense" else tuple(s.name for s in _MOE_PIPELINE)


def layer_stage(stage: str, mlp_kind: str = "dense") -> Stage:
    """The :class:`Stage` called ``stage`` in a layer of that kind (``mlp`` differs between kinds)."""
    for s in layer_stages(mlp_kind):
        if s.name == stage:
            return s
    raise KeyError(f"{stage!r} is not a stage of a {mlp_kind} layer; its stages: "
                   f"{', '.join(layer_stage_names(mlp_kind))}")


def stage_inputs(stage: str, mlp_kind: str = "dense") -> tuple[str, ...]:
    """The tensors ``stage`` reads (its golden inputs in stage-isolated mode) in a layer of that kind."""
    return layer_stage(stage, mlp_kind).inputs


def stage_outputs(stage: str, mlp_kind: str = "dense") -> tuple[str, ...]:
    """What ``stage`` returns, in its return order (state last), in a layer of that kind."""
    return layer_stage(stage, mlp_kind).outputs


def layer_tensors(mlp_kind: str = "dense") -> tuple[TensorSpec, ...]:
    """Every stage tensor of one call, in pipeline order (:data:`STAGE_TENSORS` for ``dense``)."""
    return STAGE_TENSORS if _kind(mlp_kind) == "dense" else tuple(t for s in _MOE_PIPELINE for t in s.tensors)


def layer_tensor_order(mlp_kind: str = "dense") -> tuple[str, ...]:
    """Every tensor of one call, states included, in pipeline order (:data:`TENSOR_ORDER` for ``dense``)."""
    return TENSOR_ORDER if _kind(mlp_kind) == "dense" else tuple(n for s in _MOE_PIPELINE for n in s.outputs)


def moe_layer_tensor_names() -> tuple[str, ...]:
    """The trace of a layer with the sparse block, in pipeline order: the dense trace with the
    block's tensors between ``h_norm`` and ``mlp_out``."""
    return tuple(t.name for t in layer_tensors("moe"))


# --- names of either kind ------------------------------------------------------------------------------
#: Every stage tensor of either layer kind, by name (:data:`TENSOR_BY_NAME` plus the block's).
KNOWN_TENSORS: dict[str, TensorSpec] = {**TENSOR_BY_NAME, **MOE_TENSOR_BY_NAME}
#: Every stage name of either kind in pipeline order (the sparse layer's pipeline holds the dense one's).
PIPELINE_ORDER: tuple[str, ...] = layer_stage_names("moe")
#: Every tensor of either kind in pipeline order (the sparse layer's order holds the dense one's).
_RANKED: tuple[str, ...] = layer_tensor_order("moe")

_PRODUCER.update({t.name: t.stage for t in MOE_TENSORS})
_STAGE_INDEX: dict[str, int] = {s.name: s.index for s in _MOE_PIPELINE}


def is_index_tensor(tensor: str) -> bool:
    """Whether ``tensor`` holds integers (expert indices), judged exactly."""
    return tensor in INDEX_TENSORS


def stage_rank(stage: str) -> int:
    """Position of ``stage`` in the pipeline of either kind (:data:`PIPELINE_ORDER`), finer than
    :func:`stage_index` inside stage 11; :data:`STATE_STAGE` after every stage. For dense stages it
    orders them as :func:`stage_index` does."""
    return len(PIPELINE_ORDER) if stage == STATE_STAGE else PIPELINE_ORDER.index(stage)
