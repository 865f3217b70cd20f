"""The weights of one GDN layer by their Hugging Face names (docs/spec.md §1), and their validation.

A layer with the sparse mixture-of-experts block (``cfg.mlp_kind(layer) == "moe"``) has the weights
of :data:`gdncheck.experts.MOE_WEIGHT_NAMES` in place of the dense MLP's three.

Neutral: no math. Arrays keep the values the checkpoint stored, exactly (bf16 and f16 as
float32, f32 as float32, f64 as float64); each implementation casts to its own precision.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from .config import GDNConfig
from .errors import (
    ConvKernelMismatchError,
    MissingWeightError,
    ProjectionLayoutError,
    ProjectionSizeError,
    WeightError,
    WeightShapeError,
)
from .experts import MOE_WEIGHT_NAMES, PER_EXPERT, SHAPE_WORDS, moe_expected_shapes

WEIGHT_NAMES: tuple[str, ...] = (
    "input_layernorm.weight",
    "linear_attn.in_proj_qkv.weight",
    "linear_attn.in_proj_z.weight",
    "linear_attn.in_proj_a.weight",
    "linear_attn.in_proj_b.weight",
    "linear_attn.conv1d.weight",
    "linear_attn.dt_bias",
    "linear_attn.A_log",
    "linear_attn.norm.weight",
    "linear_attn.out_proj.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)

#: The dense MLP's weights (the last three of :data:`WEIGHT_NAMES`).
DENSE_MLP_NAMES: tuple[str, ...] = WEIGHT_NAMES[-3:]


def layer_weight_names(cfg: GDNConfig, layer: int | None = None) -> tuple[str, ...]:
    """The canonical weight names of layer ``layer``: the token mixer and norms, then its MLP block's."""
    mixer = WEIGHT_NAMES[: -len(DENSE_MLP_NAMES)]
    return mixer + (MOE_WEIGHT_NAMES if cfg.mlp_kind(layer) == "moe" else DENSE_MLP_NAMES)


def expected_shapes(cfg: GDNConfig, norm_mode: str = "shared", mlp_kind: str = "dense") -> dict[str, tuple[int, ...]]:
    D, I, Hv = cfg.hidden_size, cfg.intermediate_size, cfg.num_v_heads
    shapes = {
        "input_layernorm.weight": (D,),
        "linear_attn.in_proj_qkv.weight": (cfg.conv_dim, D),
        "linear_attn.in_proj_z.weight": (cfg.value_dim, D),
        "linear_attn.in_proj_a.weight": (Hv, D),
        "linear_attn.in_proj_b.weight": (Hv, D),
        "linear_attn.conv1d.weight": (cfg.conv_dim, 1, cfg.conv_kernel),
        "linear_attn.dt_bias": (Hv,),
        "linear_attn.A_log": (Hv,),
        "linear_attn.norm.weight": (cfg.head_v_dim,) if norm_mode == "shared" else (cfg.value_dim,),
        "linear_attn.out_proj.weight": (D, cfg.value_dim),
        "post_attention_layernorm.weight": (D,),
        "mlp.gate_proj.weight": (I, D),
        "mlp.up_proj.weight": (I, D),
        "mlp.down_proj.weight": (D, I),
    }
    if mlp_kind == "moe":
        for name in DENSE_MLP_NAMES:
            del shapes[name]
        shapes.update(moe_expected_shapes(cfg))
    return shapes


class LayerWeights(Mapping):
    """Weights of one layer: name -> array, plus where they came from and how they were stored."""

    def __init__(
        self,
        arrays: Mapping[str, np.ndarray],
        *,
        stored_dtypes: Mapping[str, str] | None = None,
        layer: int | None = None,
        source: str = "memory",
        config: GDNConfig | None = None,
    ):
        self._arrays = {k: np.asarray(v) for k, v in arrays.items()}
        self.stored_dtypes = dict(stored_dtypes or {})
        self.layer = layer
        self.source = source
        self.config = config

    def __getitem__(self, name: str) -> np.ndarray:
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def __repr__(self) -> str:
        return f"LayerWeights(layer={self.layer}, source={self.source!r}, {len(self)} tensors)"


#: Qwen3-Next's fused projections (docs/math.md §3) -> the canonical weights each is split into.
FUSED_PROJECTIONS: dict[str, tuple[str, ...]] = {
    "linear_attn.in_proj_qkvz.weight": ("linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight"),
    "linear_attn.in_proj_ba.weight": ("linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight"),
}


def check_projection_layout(names, layer: int | None = None) -> None:
    """Refuse (:class:`ProjectionLayoutError`) a layer whose tensor ``names`` hold a fused Qwen3-Next
    projection and a canonical one it would be split into: one would silently replace the other."""
    present = set(names)
    for fused, parts in FUSED_PROJECTIONS.items():
        both = [p for p in parts if p in present]
        if fused in present and both:
            raise ProjectionLayoutError(
                f"expected either the fused projection {fused} (Qwen3-Next) or the canonical "
                f"{' and '.join(parts)} (Qwen3.5), found both {fused} and {', '.join(both)}",
                layer=layer, name=fused,
            )


def validate_weights(cfg: GDNConfig, weights: Mapping[str, np.ndarray], layer: int | None = None) -> str:
    """Check names and shapes against ``cfg``; return the resolved norm mode (docs/spec.md §5).

    Order: the projection layout (fused and canonical both present), missing weights, conv kernel,
    projection sizes, norm mode, every other shape, finiteness.
    The MLP block is the layer's (:meth:`GDNConfig.mlp_kind`); the sparse block's experts are
    expected stacked (:mod:`gdncheck.experts`; ``load_layer`` stacks a checkpoint's per-expert tensors).
    """
    check_projection_layout(weights, layer)
    kind = cfg.mlp_kind(layer)
    names = layer_weight_names(cfg, layer)
    missing = [n for n in names if n not in weights]
    if missing:
        per_expert = any(PER_EXPERT.match(n) for n in weights)
        raise MissingWeightError(
            f"expected all {len(names)} weights of a GDN layer"
            + (" with a mixture-of-experts block" if kind == "moe" else "")
            + f", missing {len(missing)}: " + ", ".join(missing)
            + (" (found per-expert mlp.experts.{e}.*.weight tensors: stack them with "
               "gdncheck.experts.stack_experts)" if per_expert else ""),
            layer=layer,
            name=missing[0],
        )
    conv = np.shape(weights["linear_attn.conv1d.weight"])
    if len(conv) not in (2, 3) or (len(conv) == 3 and conv[1] != 1):
        raise WeightShapeError(
            f"expected conv1d weight of shape [conv_dim, 1, K], found {list(conv)}",
            layer=layer, name="linear_attn.conv1d.weight",
        )
    if conv[-1] != cfg.conv_kernel:
        raise ConvKernelMismatchError(
            f"config declares linear_conv_kernel_dim={cfg.conv_kernel}, but the conv1d weight of shape "
            f"{list(conv)} implies {conv[-1]}",
            layer=layer, name="linear_attn.conv1d.weight",
        )
    qkv = np.shape(weights["linear_attn.in_proj_qkv.weight"])
    if len(qkv) != 2 or qkv[0] != cfg.conv_dim:
        raise ProjectionSizeError(
            f"projection mismatch: expected in_proj_qkv rows [Q, K, V] = [{cfg.key_dim}, {cfg.key_dim}, "
            f"{cfg.value_dim}] ({cfg.conv_dim} rows from Hk={cfg.num_k_heads} dk={cfg.head_k_dim} "
            f"Hv={cfg.num_v_heads} dv={cfg.head_v_dim}), found shape {list(qkv)}",
            layer=layer, name="linear_attn.in_proj_qkv.weight",
        )
    if conv[0] != cfg.conv_dim:
        raise ProjectionSizeError(
            f"projection mismatch: expected conv1d channels [Q, K, V] = [{cfg.key_dim}, {cfg.key_dim}, "
            f"{cfg.value_dim}] ({cfg.conv_dim}), found {conv[0]}",
            layer=layer, name="linear_attn.conv1d.weight",
        )
    norm_size = int(np.size(weights["linear_attn.norm.weight"]))
    mode = cfg.resolve_norm_mode(norm_size, layer=layer)
    shapes = expected_shapes(cfg, mode, kind)
    for name in names:
        found = tuple(np.shape(weights[name]))
        want = shapes[name]
        if name == "linear_attn.conv1d.weight" and found == (cfg.conv_dim, cfg.conv_kernel):
            continue
        if found != want:
            words = f" {SHAPE_WORDS[name]}" if name in SHAPE_WORDS else ""
            raise WeightShapeError(f"expected shape {list(want)}{words}, found {list(found)}", layer=layer, name=name)
    for name in names:
        arr = np.asarray(weights[name])
        if not np.issubdtype(arr.dtype, np.floating):
            raise WeightError(f"expected a floating-point weight, found dtype {arr.dtype}", layer=layer, name=name)
        if not np.isfinite(arr).all():
            bad = int((~np.isfinite(arr)).sum())
            raise WeightError(f"expected finite values, found {bad} NaN/inf", layer=layer, name=name)
    return mode


def conv_weight_2d(w: np.ndarray) -> np.ndarray:
    """[conv_dim, 1, K] or [conv_dim, K] -> [conv_dim, K]."""
    w = np.asarray(w)
    return w.reshape(w.shape[0], w.shape[-1])
