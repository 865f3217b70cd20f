"""Every error gdncheck raises, one class per failure of docs/spec.md §5 under one base class.

Each message says what was expected, what was found, and where (layer index, weight name,
file). Each class carries a stable ``code``: the fixture format names expected errors by it, so
a port in any language can say which error it raised without sharing Python class names.
"""

from __future__ import annotations


class GDNError(Exception):
    """Base class of every gdncheck error."""

    code = "gdn_error"

    def __init__(self, message: str, *, layer: int | None = None, name: str | None = None):
        self.layer = layer
        self.name = name
        where = []
        if layer is not None:
            where.append(f"layer {layer}")
        if name is not None:
            where.append(f"'{name}'")
        self.where = ", ".join(where)
        super().__init__(f"{message} [{self.where}]" if where else message)


# --- configuration -------------------------------------------------------------------------


class ConfigError(GDNError):
    """A configuration that cannot describe a GDN layer."""

    code = "config_error"


class MissingConfigKeyError(ConfigError):
    code = "missing_config_key"


class MissingHeadSettingError(MissingConfigKeyError):
    code = "missing_head_setting"


class MissingLayerSizeError(MissingConfigKeyError):
    """A config without ``hidden_size``, or without ``intermediate_size`` where a layer's MLP is dense."""

    code = "missing_layer_size"


class HeadRatioError(ConfigError):
    code = "head_ratio"


class InvalidEpsError(ConfigError):
    code = "invalid_eps"


class UnknownNormModeError(ConfigError):
    code = "unknown_norm_mode"


class NormModeConflictError(ConfigError):
    code = "norm_mode_conflict"


class NormWeightSizeError(ConfigError):
    code = "norm_weight_size"


class FullAttentionLayerError(ConfigError):
    code = "full_attention_layer"


class LayerIndexError(ConfigError):
    code = "layer_index"


class LayerOptionError(GDNError, ValueError):
    """A layer option that is none of its choices: ``delta_rule`` not ``auto``, ``recurrent`` or
    ``chunked``, a ``chunk_size`` that is no positive integer (or, for the Triton layer, none of its
    kernel's sizes), an unknown ``profile``. A ``ValueError`` too, as these were before."""

    code = "layer_option"


class EnvironmentVariableError(GDNError, ValueError):
    """A ``GDN_*`` environment variable whose value gdncheck cannot use (gdncheck/env.py lists them)."""

    code = "environment_variable"


# --- weights and checkpoints ---------------------------------------------------------------


class WeightError(GDNError):
    code = "weight_error"


class MissingWeightError(WeightError):
    code = "missing_weight"


class WeightShapeError(WeightError):
    code = "weight_shape"


class ProjectionSizeError(WeightError):
    code = "projection_size"


class ConvKernelMismatchError(WeightError):
    code = "conv_kernel_mismatch"


class ProjectionLayoutError(WeightError):
    """A layer holding both the fused Qwen3-Next projection (``in_proj_qkvz``, ``in_proj_ba``) and the
    canonical ones it would be split into: which of the two to use would be a guess."""

    code = "projection_layout"


class CheckpointError(GDNError):
    code = "checkpoint"


class SafetensorsFormatError(CheckpointError):
    code = "safetensors_format"


# --- inputs and state ----------------------------------------------------------------------


class InputError(GDNError):
    code = "input_error"


class InputShapeError(InputError):
    code = "input_shape"


class InputDtypeError(InputError):
    code = "input_dtype"


class BatchSizeError(InputError, ValueError):
    """``new_state(batch)``: a batch that is no positive integer, or a state of more elements than
    gdncheck's bound (checked before anything is allocated). A ``ValueError`` too, as it was before."""

    code = "batch_size"


class SeqPosMismatchError(GDNError):
    """Strict mode: a call's ``seq_pos`` differs from the state's ``seq_len``."""

    code = "seq_pos_mismatch"


class SnapshotError(GDNError):
    code = "snapshot"


class SnapshotSchemaError(SnapshotError):
    code = "snapshot_schema"


class SnapshotDimensionError(SnapshotError):
    code = "snapshot_dimensions"


class SnapshotCorruptError(SnapshotError):
    code = "snapshot_corrupt"


# --- serving calls: packed sequences, state slots, speculative verify (docs/serving.md) -------


class CuSeqlensError(InputError):
    """``cu_seqlens`` is not a 1-D integer array that starts at 0, never decreases and ends at the
    number of packed tokens."""

    code = "cu_seqlens"


class EmptySequenceError(InputError):
    """A packed sequence of no tokens (two equal consecutive ``cu_seqlens`` entries)."""

    code = "empty_sequence"


class SlotIndexError(InputError):
    """A slot id neither the padding id nor inside the pool ``[0, S)`` (or a snapshot sent to the
    padding slot)."""

    code = "slot_index"


class DuplicateSlotError(InputError):
    """One call names a pool slot twice (two sequences, or a snapshot and a sequence): the order of the
    writes would decide the result."""

    code = "duplicate_slot"


class AcceptCountError(InputError):
    """``commit``: an accepted count outside ``0..k`` for its sequence (k: its verified tokens)."""

    code = "accept_count"


class SnapshotRequestError(InputError):
    """A prefix-snapshot request that names no real sequence of the call, or an offset outside
    ``1..length`` of its sequence, or the same (sequence, offset) twice."""

    code = "snapshot_request"


class SpecCommitError(GDNError):
    """``commit`` of a verify that was already committed, or whose slots another call moved since."""

    code = "spec_commit"

class ShardPlanError(ConfigError):
    """A partition plan (tensor or context parallel, docs/sharding.md) that cannot split this layer or call."""

    code = "shard_plan"


# --- mixture of experts (Qwen3.5-MoE, Qwen3-Next; docs/moe.md) -------------------------------


class MoEConfigError(ConfigError):
    """A mixture-of-experts setting that cannot describe a sparse MLP block."""

    code = "moe_config"


class ExpertCountError(MoEConfigError):
    """``num_experts`` not a positive integer where the block must have experts."""

    code = "expert_count"


class TopKError(MoEConfigError):
    """``num_experts_per_tok`` below 1 or above ``num_experts``."""

    code = "moe_top_k"


class MissingExpertError(MissingWeightError):
    """An expert's projection absent from the checkpoint (named by its checkpoint name)."""

    code = "missing_expert"


class ExpertLayoutError(WeightError):
    """Expert weights that fit no layout: both per-expert and stacked tensors, or an expert index
    at or beyond ``num_experts``."""

    code = "expert_layout"


def all_error_classes() -> list[type[GDNError]]:
    """Every error class, base first; codes are unique."""
    seen: list[type[GDNError]] = []
    stack: list[type[GDNError]] = [GDNError]
    while stack:
        cls = stack.pop(0)
        seen.append(cls)
        stack.extend(cls.__subclasses__())
    return seen


def error_class_for_code(code: str) -> type[GDNError]:
    for cls in all_error_classes():
        if cls.code == code:
            return cls
    raise KeyError(f"no gdncheck error has code {code!r}")
