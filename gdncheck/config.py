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
    FullAttentionLayerError,
    HeadRatioError,
    InvalidEpsError,
    LayerIndexError,
    MissingConfigKeyError,
    MissingHeadSettingError,
    NormModeConflictError,
    NormWeightSizeError,
    UnknownNormModeError,
)

NORM_MODES = ("shared", "per_head")
NORM_MODE_ALIASES = {"shared": "shared", "per_head": "per_head", "per-head": "per_head", "perhead": "per_head"}

HEAD_KEYS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")
LINEAR_LAYER_TYPES = ("linear_attention",)


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


def _positive_int(d: dict, key: str, error=MissingConfigKeyError) -> int:
    if key not in d or d[key] is None:
        raise error(f"config key {key!r} is required, found it missing")
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value or value <= 0:
        raise ConfigError(f"config key {key!r} must be a positive integer, found {value!r}")
    return int(value)


@dataclass(frozen=True)
class GDNConfig:
    """Dimensions and constants of one Qwen3.5 GDN decoder layer.

    Attribute names are short; :meth:`from_hf` and :meth:`to_hf` use the Hugging Face keys.
    """

    hidden_size: int
    intermediate_size: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int = 4
    rms_norm_eps: float = 1e-6
    norm_mode: str | None = None  # declared linear_norm_mode; None means infer from the weight
    layer_types: tuple[str, ...] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for key in ("hidden_size", "intermediate_size", "num_k_heads", "num_v_heads", "head_k_dim",
                    "head_v_dim", "conv_kernel"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{key} must be a positive integer, found {value!r}")
        eps = self.rms_norm_eps
        if not isinstance(eps, int | float) or isinstance(eps, bool) or not math.isfinite(eps) or eps <= 0:
            raise InvalidEpsError(f"rms_norm_eps must be a positive finite number, found {eps!r}")
        if self.num_v_heads % self.num_k_heads:
            raise HeadRatioError(
                f"linear_num_value_heads must be a multiple of linear_num_key_heads, found "
                f"{self.num_v_heads} value heads and {self.num_k_heads} key heads"
            )
        object.__setattr__(self, "norm_mode", normalize_norm_mode(self.norm_mode))

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

    def dims(self) -> dict[str, int]:
        """Values of the shape symbols of :mod:`gdncheck.stages`."""
        return {
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

    def state_fingerprint(self) -> str:
        """A short stable hash of the dimensions that shape the state (snapshot compatibility)."""
        dims = {k: v for k, v in self.dims().items() if k in ("Hk", "Hv", "dk", "dv", "K", "conv_dim")}
        blob = json.dumps(dims, sort_keys=True).encode()
        return "gdn-state:" + hashlib.sha256(blob).hexdigest()[:16]

    def summary(self) -> str:
        return (
            f"D={self.hidden_size} I={self.intermediate_size} Hk={self.num_k_heads} Hv={self.num_v_heads} "
            f"dk={self.head_k_dim} dv={self.head_v_dim} K={self.conv_kernel} eps={self.rms_norm_eps:g}"
            + (f" norm={self.norm_mode}" if self.norm_mode else "")
        )

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
        layer_types = d.get("layer_types")
        if layer_types is None and d.get("full_attention_interval") and d.get("num_hidden_layers"):
            interval = int(d["full_attention_interval"])
            layer_types = [
                "full_attention" if (i + 1) % interval == 0 else "linear_attention"
                for i in range(int(d["num_hidden_layers"]))
            ]
        eps = d.get("rms_norm_eps", 1e-6)
        return cls(
            hidden_size=_positive_int(d, "hidden_size"),
            intermediate_size=_positive_int(d, "intermediate_size"),
            num_k_heads=heads["linear_num_key_heads"],
            num_v_heads=heads["linear_num_value_heads"],
            head_k_dim=heads["linear_key_head_dim"],
            head_v_dim=heads["linear_value_head_dim"],
            conv_kernel=_positive_int(d, "linear_conv_kernel_dim") if "linear_conv_kernel_dim" in d else 4,
            rms_norm_eps=eps,
            norm_mode=d.get("linear_norm_mode"),
            layer_types=tuple(layer_types) if layer_types is not None else None,
        )

    def to_hf(self) -> dict[str, Any]:
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
        return out

    def replace(self, **changes: Any) -> GDNConfig:
        fields = asdict(self)
        fields.update(changes)
        return GDNConfig(**fields)


def _ranges(indices: list[int]) -> str:
    if not indices:
        return "none"
    return "[" + ", ".join(str(i) for i in indices[:12]) + (", ..." if len(indices) > 12 else "") + "]"
