"""The layer configuration (docs/spec.md §1), built from a Hugging Face ``config.json`` dict.

Neutral: both ``reference/`` and ``gpu_impl/`` import it; it holds no math.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import (
    ConfigError,
    ExpertCountError,
    FullAttentionLayerError,
    HeadRatioError,
    InvalidEpsError,
    LayerIndexError,
    MissingConfigKeyError,
    MissingHeadSettingError,
    MissingLayerSizeError,
    MoEConfigError,
    NormModeConflictError,
    NormWeightSizeError,
    TopKError,
    UnknownNormModeError,
)

NORM_MODES = ("shared", "per_head")
NORM_MODE_ALIASES = {"shared": "shared", "per_head": "per_head", "per-head": "per_head", "perhead": "per_head"}

HEAD_KEYS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")
LINEAR_LAYER_TYPES = ("linear_attention",)

#: The largest value gdncheck accepts per size (attribute name -> bound): far above every Qwen3.5 and
#: Qwen3-Next layer (D 2048-8192, heads <= 64, head dims 128-256, K 4, I <= 32K, 512 experts), far
#: below what would ask for absurd memory. A config past one is refused with the bound it broke.
SIZE_BOUNDS: dict[str, int] = {
    "hidden_size": 1 << 17, "intermediate_size": 1 << 20, "num_k_heads": 1 << 12, "num_v_heads": 1 << 12,
    "head_k_dim": 1 << 12, "head_v_dim": 1 << 12, "conv_kernel": 1 << 8, "num_experts": 1 << 16,
    "moe_intermediate_size": 1 << 20, "shared_expert_intermediate_size": 1 << 20, "decoder_sparse_step": 1 << 16,
}
#: Layers a config may list (``layer_types``, ``num_hidden_layers``).
MAX_LAYERS = 1 << 16
#: Elements of one sequence's state (``Hv·dk·dv + conv_dim·K``; Qwen3.5: about 1.1 M).
MAX_STATE_ELEMENTS = 1 << 28
#: Elements of the largest weight matrix (``D·conv_dim``, ``D·I``, the stacked experts ``E·I_moe·D``).
MAX_MATRIX_ELEMENTS = 1 << 34
_HF_KEY = {"num_k_heads": "linear_num_key_heads", "num_v_heads": "linear_num_value_heads",
           "head_k_dim": "linear_key_head_dim", "head_v_dim": "linear_value_head_dim",
           "conv_kernel": "linear_conv_kernel_dim"}

#: The MLP block of a layer: the dense SwiGLU MLP, or the sparse mixture of experts.
MLP_KINDS = ("dense", "moe")
#: Model types whose every layer has the sparse block, always renormalising the top-k weights
#: (transformers' Qwen3_5MoeTextConfig deletes norm_topk_prob, decoder_sparse_step, mlp_only_layers).
ALWAYS_SPARSE_MODEL_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")


def normalize_norm_mode(value: Any, layer: int | None = None) -> str | None:
    """``None`` (infer) or one of :data:`NORM_MODES`; aliases ``per-head`` and ``perhead`` accepted."""
    if value is None:
        return None
    key = str(value).strip().lower()
    if key not in NORM_MODE_ALIASES:
        raise UnknownNormModeError(
            f"linear_norm_mode must be one of 'shared', 'per_head' (aliases 'per-head', 'perhead'), "
            f"found {value!r}",
            layer=layer,
        )
    return NORM_MODE_ALIASES[key]


def _positive_int(d: dict, key: str, error=MissingConfigKeyError, why: str = "") -> int:
    if key not in d or d[key] is None:
        raise error(f"config key {key!r} is required{why}, found it missing")
    value = d[key]
    if not _is_int(value) or value <= 0:
        raise ConfigError(f"config key {key!r} must be a positive integer, found {_brief(value)}")
    return int(value)


def _is_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value) and \
        int(value) == value


def _moe_from_hf(d: dict) -> dict[str, Any]:
    """The mixture-of-experts fields of :class:`GDNConfig` from a Hugging Face dict ({} for a dense model).

    transformers' rules: Qwen3.5-MoE (``model_type`` ``qwen3_5_moe[_text]``) puts the sparse block in
    every layer and always renormalises the top-k weights; Qwen3-Next makes layer ``i`` sparse when
    ``num_experts > 0``, ``i`` is not in ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0``,
    and renormalises when ``norm_topk_prob`` (default true).
    """
    if d.get("num_experts") is None:
        return {}
    model_type = str(d.get("model_type") or "")
    always_sparse = model_type in ALWAYS_SPARSE_MODEL_TYPES
    E = d["num_experts"]
    if not _is_int(E) or E < 0:
        raise ExpertCountError(f"config key 'num_experts' must be a non-negative integer, found {E!r}")
    if E == 0:
        if always_sparse or d.get("intermediate_size") is None:
            raise ExpertCountError(
                "expected num_experts >= 1 for a sparse MLP block"
                + (f" (model_type {model_type!r} has one in every layer)" if always_sparse else
                   " (or an intermediate_size for a dense MLP, as Qwen3-Next reads num_experts = 0)")
                + ", found num_experts = 0")
        return {}
    why = " for a mixture-of-experts block (num_experts is set)"
    k = d.get("num_experts_per_tok")
    if k is None:
        raise MissingConfigKeyError(f"config key 'num_experts_per_tok' is required{why}, found it missing")
    if not _is_int(k):
        raise TopKError(f"num_experts_per_tok must be an integer in [1, num_experts = {int(E)}], found {k!r}")
    fields: dict[str, Any] = {
        "num_experts": int(E),
        "num_experts_per_tok": int(k),
        "moe_intermediate_size": _positive_int(d, "moe_intermediate_size", why=why),
        "shared_expert_intermediate_size": _positive_int(d, "shared_expert_intermediate_size", why=why),
    }
    declared = {key: d[key] for key in ("norm_topk_prob", "decoder_sparse_step", "mlp_only_layers")
                if d.get(key) is not None}
    if always_sparse:
        # transformers ignores these keys for Qwen3.5-MoE; a value that contradicts what it then does
        # is refused rather than silently dropped
        fixed = {"norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}
        for key, value in declared.items():
            if (list(value) if isinstance(value, list | tuple) else value) != fixed[key]:
                raise MoEConfigError(
                    f"model_type {model_type!r} has the sparse block in every layer and always renormalises "
                    f"the top-k weights (transformers ignores {key}), so {key} must be absent or "
                    f"{json.dumps(fixed[key])}, found {value!r}")
        return fields
    if "norm_topk_prob" in declared:
        if not isinstance(declared["norm_topk_prob"], bool):
            raise MoEConfigError(f"norm_topk_prob must be true or false, found {declared['norm_topk_prob']!r}")
        fields["norm_topk_prob"] = declared["norm_topk_prob"]
    if "decoder_sparse_step" in declared:
        fields["decoder_sparse_step"] = _positive_int(d, "decoder_sparse_step")
    if "mlp_only_layers" in declared:
        layers = declared["mlp_only_layers"]
        if not isinstance(layers, list | tuple) or not all(_is_int(i) and i >= 0 for i in layers):
            raise MoEConfigError(f"mlp_only_layers must be a list of layer indices, found {layers!r}")
        fields["mlp_only_layers"] = tuple(sorted({int(i) for i in layers}))
    return fields


@dataclass(frozen=True)
class GDNConfig:
    """Dimensions and constants of one Qwen3.5 GDN decoder layer.

    Attribute names are short; :meth:`from_hf` and :meth:`to_hf` use the Hugging Face keys.
    """

    hidden_size: int
    intermediate_size: int | None  # the dense MLP's; None in a model whose every MLP is sparse
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int = 4
    rms_norm_eps: float = 1e-6
    norm_mode: str | None = None  # declared linear_norm_mode; None means infer from the weight
    layer_types: tuple[str, ...] | None = field(default=None, compare=False)
    # --- the sparse MLP block (docs/moe.md); num_experts None: every MLP is dense ---
    num_experts: int | None = None
    num_experts_per_tok: int | None = None
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int | None = None
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        sizes = ["hidden_size", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "conv_kernel"]
        if self.num_experts is None or self.intermediate_size is not None:
            sizes.append("intermediate_size")
        for key in sizes:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{key} must be a positive integer, found {value!r}")
        self._check_moe()
        self._check_bounds()
        eps = self.rms_norm_eps
        if not isinstance(eps, int | float) or isinstance(eps, bool) or not math.isfinite(eps) or eps <= 0:
            raise InvalidEpsError(f"rms_norm_eps must be a positive finite number, found {eps!r}")
        if self.num_v_heads % self.num_k_heads:
            raise HeadRatioError(
                f"linear_num_value_heads must be a multiple of linear_num_key_heads, found "
                f"{self.num_v_heads} value heads and {self.num_k_heads} key heads"
            )
        object.__setattr__(self, "norm_mode", normalize_norm_mode(self.norm_mode))

    def _check_bounds(self) -> None:
        """Every size within :data:`SIZE_BOUNDS`, the state and the largest matrix within theirs."""
        for key, bound in SIZE_BOUNDS.items():
            value = getattr(self, key)
            if value is not None and value > bound:
                raise ConfigError(f"{_HF_KEY.get(key, key)} must be at most {bound} (gdncheck's bound on a layer's "
                                  f"sizes), found {_brief(value)}")
        state = self.num_v_heads * self.head_k_dim * self.head_v_dim + self.conv_dim * self.conv_kernel
        if state > MAX_STATE_ELEMENTS:
            raise ConfigError(f"one sequence's state would hold {state} elements (Hv·dk·dv + conv_dim·K), more than "
                              f"gdncheck's bound {MAX_STATE_ELEMENTS}; check the head settings")
        D = self.hidden_size
        matrices = {"D·conv_dim (in_proj_qkv)": D * self.conv_dim, "D·I (the MLP)": D * (self.intermediate_size or 0),
                    "E·I_moe·D (the experts)": (self.num_experts or 0) * (self.moe_intermediate_size or 0) * D}
        name, size = max(matrices.items(), key=lambda kv: kv[1])
        if size > MAX_MATRIX_ELEMENTS:
            raise ConfigError(f"the weights {name} would hold {size} elements, more than gdncheck's bound "
                              f"{MAX_MATRIX_ELEMENTS}; check hidden_size and the projection sizes")

    def _check_moe(self) -> None:
        E, k = self.num_experts, self.num_experts_per_tok
        object.__setattr__(self, "mlp_only_layers", tuple(self.mlp_only_layers))
        if E is None:
            given = [key for key in ("num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")
                     if getattr(self, key) is not None]
            if given:
                raise MoEConfigError(f"expected num_experts with {', '.join(given)}, found num_experts unset")
            return
        if isinstance(E, bool) or not isinstance(E, int) or E < 1:
            raise ExpertCountError(f"expected num_experts >= 1 for a sparse MLP block, found {E!r}")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= E:
            raise TopKError(f"num_experts_per_tok must be an integer in [1, num_experts = {E}], found {k!r}")
        for key in ("moe_intermediate_size", "shared_expert_intermediate_size", "decoder_sparse_step"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise MoEConfigError(f"{key} must be a positive integer, found {value!r}")
        if not isinstance(self.norm_topk_prob, bool):
            raise MoEConfigError(f"norm_topk_prob must be true or false, found {self.norm_topk_prob!r}")

    # --- derived sizes ------------------------------------------------------------------------
    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def head_ratio(self) -> int:
        return self.num_v_heads // self.num_k_heads

    @property
    def scale(self) -> float:
        """The query scale dk^-0.5."""
        return self.head_k_dim ** -0.5

    @property
    def has_experts(self) -> bool:
        """Whether some layer of the model has the sparse mixture-of-experts block."""
        return self.num_experts is not None

    def dims(self) -> dict[str, int]:
        """Values of the shape symbols of :mod:`gdncheck.stages` (the MoE symbols when there are experts)."""
        out = {
            "D": self.hidden_size,
            "I": self.intermediate_size,
            "Hk": self.num_k_heads,
            "Hv": self.num_v_heads,
            "dk": self.head_k_dim,
            "dv": self.head_v_dim,
            "K": self.conv_kernel,
            "conv_dim": self.conv_dim,
            "key_dim": self.key_dim,
            "value_dim": self.value_dim,
        }
        if self.intermediate_size is None:
            del out["I"]
        if self.num_experts is not None:
            out.update({"E": self.num_experts, "top_k": self.num_experts_per_tok,
                        "I_moe": self.moe_intermediate_size, "I_shared": self.shared_expert_intermediate_size})
        return out

    def state_fingerprint(self) -> str:
        """A short stable hash of the dimensions that shape the state (snapshot compatibility)."""
        return state_fingerprint(self.dims())

    def summary(self) -> str:
        moe = ""
        if self.num_experts is not None:
            moe = (f" E={self.num_experts} top_k={self.num_experts_per_tok} I_moe={self.moe_intermediate_size} "
                   f"I_shared={self.shared_expert_intermediate_size}"
                   + ("" if self.norm_topk_prob else " norm_topk_prob=false"))
        return (
            f"D={self.hidden_size}" + (f" I={self.intermediate_size}" if self.intermediate_size else "")
            + f" Hk={self.num_k_heads} Hv={self.num_v_heads} "
            f"dk={self.head_k_dim} dv={self.head_v_dim} K={self.conv_kernel} eps={self.rms_norm_eps:g}"
            + (f" norm={self.norm_mode}" if self.norm_mode else "") + moe
        )

    # --- the MLP block of a layer ---------------------------------------------------------------
    def mlp_kind(self, layer: int | None = None) -> str:
        """``"moe"`` where layer ``layer`` has the sparse block, ``"dense"`` where it has the SwiGLU MLP.

        The rule is transformers' Qwen3-Next one (Qwen3.5-MoE is its case with every layer sparse):
        sparse when there are experts, ``layer`` is not in ``mlp_only_layers`` and
        ``(layer + 1) % decoder_sparse_step == 0``. ``layer=None`` is allowed where every layer has the
        same block.
        """
        if self.num_experts is None:
            return "dense"
        if layer is None:
            if self.decoder_sparse_step == 1 and not self.mlp_only_layers:
                return "moe"
            raise LayerIndexError(
                f"this config mixes sparse and dense MLP layers (decoder_sparse_step={self.decoder_sparse_step}, "
                f"mlp_only_layers={list(self.mlp_only_layers)}), so a layer index is needed, found none")
        sparse = layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0
        if sparse:
            return "moe"
        if self.intermediate_size is None:
            raise MissingLayerSizeError(
                f"config key 'intermediate_size' is required for the dense MLP of layer {layer} "
                f"(mlp_only_layers={list(self.mlp_only_layers)}, decoder_sparse_step={self.decoder_sparse_step}), "
                "found it missing", layer=layer)
        return "dense"

    # --- norm mode ------------------------------------------------------------------------------
    def resolve_norm_mode(self, norm_weight_size: int, layer: int | None = None) -> str:
        """The norm mode implied by ``linear_attn.norm.weight``'s element count (docs/spec.md §5).

        ``head_v_dim`` elements means ``shared``, ``value_dim`` elements ``per_head``. When the two
        coincide (one value head) the declared mode wins, else ``shared``.
        """
        name = "linear_attn.norm.weight"
        inferred: list[str] = []
        if norm_weight_size == self.head_v_dim:
            inferred.append("shared")
        if norm_weight_size == self.value_dim:
            inferred.append("per_head")
        if not inferred:
            raise NormWeightSizeError(
                f"norm weight has {norm_weight_size} elements, expected {self.head_v_dim} "
                f"(shared: linear_value_head_dim) or {self.value_dim} "
                f"(per_head: linear_num_value_heads * linear_value_head_dim)",
                layer=layer,
                name=name,
            )
        if self.norm_mode is None:
            return inferred[0]
        if self.norm_mode not in inferred:
            raise NormModeConflictError(
                f"declared linear_norm_mode={self.norm_mode!r} but the norm weight's {norm_weight_size} "
                f"elements imply {inferred[0]!r}",
                layer=layer,
                name=name,
            )
        return self.norm_mode

    # --- layers -------------------------------------------------------------------------------
    def layer_type(self, layer: int) -> str:
        if self.layer_types is None:
            return "linear_attention"
        if not 0 <= layer < len(self.layer_types):
            raise LayerIndexError(
                f"layer index must be in [0, {len(self.layer_types)}), found {layer}", layer=layer
            )
        return self.layer_types[layer]

    def check_linear_layer(self, layer: int) -> None:
        kind = self.layer_type(layer)
        if kind not in LINEAR_LAYER_TYPES:
            linear = [i for i, t in enumerate(self.layer_types or ()) if t in LINEAR_LAYER_TYPES]
            raise FullAttentionLayerError(
                f"expected a linear_attention (GDN) layer, found layer_types[{layer}] = {kind!r}; "
                f"GDN layers are {_ranges(linear)}",
                layer=layer,
            )

    # --- Hugging Face ---------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> GDNConfig:
        """Build from a Hugging Face ``config.json`` dict (a VLM's ``text_config`` is looked into)."""
        if not isinstance(config, dict):
            raise ConfigError(f"expected a config dict, found {type(config).__name__}")
        d = config
        if "linear_num_key_heads" not in d and isinstance(d.get("text_config"), dict):
            d = {**d, **d["text_config"]}
        missing = [k for k in HEAD_KEYS if d.get(k) is None]
        if missing:
            raise MissingHeadSettingError(
                f"a GDN layer needs {', '.join(HEAD_KEYS)}; missing: {', '.join(missing)}"
            )
        heads = {k: _positive_int(d, k, MissingHeadSettingError) for k in HEAD_KEYS}
        layer_types = _layer_types(d)
        eps = d.get("rms_norm_eps", 1e-6)
        moe = _moe_from_hf(d)
        dense_optional = bool(moe) and d.get("intermediate_size") is None
        return cls(
            hidden_size=_positive_int(d, "hidden_size", MissingLayerSizeError),
            intermediate_size=None if dense_optional else _positive_int(
                d, "intermediate_size", MissingLayerSizeError, " for a dense MLP (the config has no num_experts)"),
            num_k_heads=heads["linear_num_key_heads"],
            num_v_heads=heads["linear_num_value_heads"],
            head_k_dim=heads["linear_key_head_dim"],
            head_v_dim=heads["linear_value_head_dim"],
            conv_kernel=_positive_int(d, "linear_conv_kernel_dim") if "linear_conv_kernel_dim" in d else 4,
            rms_norm_eps=eps,
            norm_mode=d.get("linear_norm_mode"),
            layer_types=tuple(layer_types) if layer_types is not None else None,
            **moe,
        )

    def to_hf(self) -> dict[str, Any]:
        """The Hugging Face keys; MoE keys only when there are experts, and each of
        ``norm_topk_prob``, ``decoder_sparse_step``, ``mlp_only_layers`` only where it differs from
        the default (Qwen3.5-MoE's config has none of them)."""
        out: dict[str, Any] = {
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "rms_norm_eps": self.rms_norm_eps,
            "linear_num_key_heads": self.num_k_heads,
            "linear_num_value_heads": self.num_v_heads,
            "linear_key_head_dim": self.head_k_dim,
            "linear_value_head_dim": self.head_v_dim,
            "linear_conv_kernel_dim": self.conv_kernel,
            "hidden_act": "silu",
        }
        if self.norm_mode is not None:
            out["linear_norm_mode"] = self.norm_mode
        if self.layer_types is not None:
            out["layer_types"] = list(self.layer_types)
        if self.intermediate_size is None:
            del out["intermediate_size"]
        if self.num_experts is not None:
            out.update({"num_experts": self.num_experts, "num_experts_per_tok": self.num_experts_per_tok,
                        "moe_intermediate_size": self.moe_intermediate_size,
                        "shared_expert_intermediate_size": self.shared_expert_intermediate_size})
            if not self.norm_topk_prob:
                out["norm_topk_prob"] = False
            if self.decoder_sparse_step != 1:
                out["decoder_sparse_step"] = self.decoder_sparse_step
            if self.mlp_only_layers:
                out["mlp_only_layers"] = list(self.mlp_only_layers)
        return out

    def replace(self, **changes: Any) -> GDNConfig:
        fields = asdict(self)
        fields.update(changes)
        return GDNConfig(**fields)



#: Qwen3.5's GDN layer at its real sizes (35B-A3B: D = 2048, Hk = 16, Hv = 32, dk = dv = 128, I = 6144): what
#: the benchmarks, the compile check and the memory model measure.
REAL = GDNConfig(hidden_size=2048, intermediate_size=6144, num_k_heads=16, num_v_heads=32, head_k_dim=128,
                 head_v_dim=128, conv_kernel=4)
#: The sparse block at Qwen3-Next-80B-A3B's sizes (E = 512, top 10, I_moe = I_shared = 512, D = 2048; Qwen3.5's
#: MoE models have 256 or 512 experts of that width) on the GDN layer of REAL.
REAL_MOE = REAL.replace(intermediate_size=None, num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512,
                        shared_expert_intermediate_size=512)

def state_fingerprint(dims: dict[str, int]) -> str:
    """The state fingerprint of the shape symbols ``Hk, Hv, dk, dv, K, conv_dim`` (other keys ignored):
    what :meth:`GDNConfig.state_fingerprint` gives, and what a snapshot's own shapes give
    (:mod:`gdncheck.snapshot` recomputes it from them)."""
    picked = {k: int(v) for k, v in dims.items() if k in ("Hk", "Hv", "dk", "dv", "K", "conv_dim")}
    blob = json.dumps(picked, sort_keys=True).encode()
    return "gdn-state:" + hashlib.sha256(blob).hexdigest()[:16]


def _layer_types(d: dict) -> list[str] | None:
    """``layer_types`` as given (a list of strings), or made from ``full_attention_interval`` and
    ``num_hidden_layers`` (every interval-th layer full attention); None when neither says."""
    layer_types = d.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
            raise ConfigError(f"config key 'layer_types' must be a list of strings, found {_brief(layer_types)}")
        if len(layer_types) > MAX_LAYERS:
            raise ConfigError(f"config key 'layer_types' lists {len(layer_types)} layers, more than gdncheck's bound "
                              f"{MAX_LAYERS}")
        return layer_types
    if d.get("full_attention_interval") is None or d.get("num_hidden_layers") is None:
        return None
    interval, layers = _positive_int(d, "full_attention_interval"), _positive_int(d, "num_hidden_layers")
    if layers > MAX_LAYERS:
        raise ConfigError(f"config key 'num_hidden_layers' must be at most {MAX_LAYERS}, found {layers}")
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]


def _brief(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _ranges(indices: list[int]) -> str:
    if not indices:
        return "none"
    return "[" + ", ".join(str(i) for i in indices[:12]) + (", ..." if len(indices) > 12 else "") + "]"
