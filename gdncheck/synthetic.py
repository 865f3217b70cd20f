"""Weights, inputs and checkpoints made here, since real weights cannot be downloaded.

Weights are drawn like a Hugging Face checkpoint (``Qwen3_5PreTrainedModel._init_weights``: normal
0.02 projections, ``A = U(0.01, 16)``, ``dt_bias = 1``) but with non-trivial norm weights, and every
value is rounded to a number that bf16 and f16 both represent exactly, so every port loads the same
numbers. All draws come from one seeded NumPy generator: same seed, same bytes, on every CPU — the
arithmetic on the draws is elementwise IEEE operations and the portable ``log`` of
:mod:`gdncheck.portable` (``np.log`` may differ in its last bit between CPUs, and a rounding
to bf16 right at a boundary would carry that into a weight). Uniform draws are scaled here rather than
by ``Generator.uniform``, whose ``low + range·u`` a compiler may fuse into one multiply-add on some
CPUs; the values are the same. A layer with the
sparse mixture-of-experts block gets a router, stacked experts and a shared expert (drawn after the
token mixer's weights, which are the same as a dense layer's of the same seed).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .config import GDNConfig
from .dtypes import round_to, round_to_common
from .experts import (
    EXPERTS_DOWN,
    EXPERTS_GATE_UP,
    PER_EXPERT,
    ROUTER,
    SHARED_DOWN,
    SHARED_EXPERT_GATE,
    SHARED_GATE,
    SHARED_UP,
    unstack_experts,
)
from .portable import exp as portable_exp
from .portable import log as portable_log
from .safetensors_io import write_bytes_atomic, write_safetensors
from .weights import WEIGHT_NAMES, LayerWeights

#: The built-in demo layer: small, every feature on (GVA ratio 2, dk != dv).
DEMO_CONFIG = GDNConfig(
    hidden_size=64, intermediate_size=96, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8,
    conv_kernel=4, rms_norm_eps=1e-6,
)


def make_weights(
    cfg: GDNConfig,
    seed: int = 0,
    *,
    norm_mode: str | None = None,
    std: float = 0.02,
    norm_spread: float = 0.1,
    layer: int | None = None,
    router_std: float | None = None,
) -> LayerWeights:
    """Random layer weights like a real checkpoint, exactly representable in bf16 and f16.

    ``layer`` picks the MLP block where the config mixes dense and sparse layers. ``router_std``:
    the router's spread (default ``std``, as transformers initialises it; a larger one spreads the
    router probabilities, so that no token's routing is near a tie).
    """
    kind = cfg.mlp_kind(layer)
    rng = np.random.default_rng(seed)
    mode = norm_mode or cfg.norm_mode or "shared"
    D, I, Hv = cfg.hidden_size, cfg.intermediate_size, cfg.num_v_heads

    def normal(*shape, scale=std):
        return rng.normal(0.0, scale, size=shape)

    def uniform(low, high, *shape):
        return low + (high - low) * rng.random(shape)  # what Generator.uniform computes, unfused

    K = cfg.conv_kernel
    bound = 1.0 / np.sqrt(K)  # nn.Conv1d default init: kaiming-uniform over fan_in = K (depthwise)
    A = uniform(0.01, 16.0, Hv)
    arrays = {
        "input_layernorm.weight": normal(D, scale=norm_spread),
        "linear_attn.in_proj_qkv.weight": normal(cfg.conv_dim, D),
        "linear_attn.in_proj_z.weight": normal(cfg.value_dim, D),
        "linear_attn.in_proj_a.weight": normal(Hv, D),
        "linear_attn.in_proj_b.weight": normal(Hv, D),
        "linear_attn.conv1d.weight": uniform(-bound, bound, cfg.conv_dim, 1, K),
        "linear_attn.dt_bias": np.ones(Hv) + rng.normal(0.0, norm_spread, size=Hv),
        "linear_attn.A_log": portable_log(A),
        "linear_attn.norm.weight": 1.0 + normal(cfg.head_v_dim if mode == "shared" else cfg.value_dim,
                                                scale=norm_spread),
        "linear_attn.out_proj.weight": normal(D, cfg.value_dim),
        "post_attention_layernorm.weight": normal(D, scale=norm_spread),
    }
    if kind == "dense":
        arrays["mlp.gate_proj.weight"] = normal(I, D)
        arrays["mlp.up_proj.weight"] = normal(I, D)
        arrays["mlp.down_proj.weight"] = normal(D, I)
    else:
        E, Im, Is = cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
        arrays[ROUTER] = normal(E, D, scale=std if router_std is None else router_std)
        arrays[EXPERTS_GATE_UP] = normal(E, 2 * Im, D)
        arrays[EXPERTS_DOWN] = normal(E, D, Im)
        arrays[SHARED_GATE] = normal(Is, D)
        arrays[SHARED_UP] = normal(Is, D)
        arrays[SHARED_DOWN] = normal(D, Is)
        arrays[SHARED_EXPERT_GATE] = normal(1, D)
    arrays = {k: round_to_common(v).astype(np.float32) for k, v in arrays.items()}
    return LayerWeights(arrays, stored_dtypes={k: "BF16" for k in arrays}, source=f"synthetic(seed={seed})",
                        layer=layer, config=cfg)


#: The realistic regime of :func:`realistic_weights` and :func:`realistic_inputs` (docs/tolerances.md
#: §1.1 says why each number): the share of value heads that keep transformers' initialisation
#: (dt_bias = 1: forgetting within a few tokens), the memory (tokens) of the other heads, the range
#: of the heads' mean write logit b, the spreads of the projections' outputs, and the massive
#: channels of the residual stream (how many, their share of a token's energy, their signs), and the
#: mean of q and k before their conv's SiLU (in units of each channel's conv-tap sum).
FAST_HEAD_SHARE = 0.25
LONG_MEMORY = (32.0, 2048.0)
WRITE_OFFSET = (-5.0, 2.0)
SPREAD = {"qk": 3.0, "qkv": 1.0, "z": 1.0, "a": 1.0, "b": 1.5, "out": 0.5, "mlp_in": 1.0, "mlp_down": 0.5}
MASSIVE = 2
MASSIVE_SHARE = 0.2
MASSIVE_SIGNS = (1.0, -1.0)
QK_MEAN = 4.0


def massive_channels(hidden_size: int) -> list[int]:
    """The residual-stream channels that carry massive activations: fixed by the model (here by D),
    as in real models, so the weights can read them as a bias."""
    return [(2 * i + 1) * hidden_size // (2 * MASSIVE) for i in range(min(MASSIVE, hidden_size))]


def massive_x_norm(hidden_size: int) -> float:
    """The size of a massive channel after the input norm (before its weight): sqrt(share·D/m)."""
    return float(np.sqrt(MASSIVE_SHARE * hidden_size / MASSIVE))


def inverse_softplus(y) -> np.ndarray:
    """x with softplus(x) = y (y > 0), in the portable arithmetic (bit-identical on every CPU)."""
    y = np.asarray(y, dtype=np.float64)
    return np.where(y > 30.0, y, portable_log(np.maximum(portable_exp(np.minimum(y, 30.0)) - 1.0, 1e-300)))


#: The weights a released Qwen3.5 checkpoint stores in float32 (the rest is bf16): ``A_log`` and the gated
#: norm's weight of every linear-attention layer (fixtures/FORMAT.md §3 says where that comes from).
CHECKPOINT_F32 = ("linear_attn.A_log", "linear_attn.norm.weight")


def realistic_weights(cfg: GDNConfig, seed: int = 0, *, norm_mode: str | None = None,
                      layer: int | None = None, f32: tuple[str, ...] = ()) -> LayerWeights:
    """Weights in the regime of a trained Qwen3.5 layer, exactly representable in bf16 and f16.

    ``f32`` names weights kept as float32 values instead (:data:`CHECKPOINT_F32`: as a released
    checkpoint stores them): the float32 nearest to the draw, never a value bf16 or f16 represents
    (:func:`not_half_exact`), so a port that rounds them at load differs. The draws are the same
    either way: the other weights are bit-identical to those drawn without ``f32``.

    transformers' initialisation is the floor (`A = U(0.01, 16)`; a share `FAST_HEAD_SHARE` of the
    value heads forgets within a few tokens); the other heads remember `M` tokens, log-uniform over
    `LONG_MEMORY`. Projections are scaled by `1/sqrt(fan_in)` times `SPREAD`, so z, a, b, q and k are
    unit-order; q and k get a mean of `QK_MEAN` and each head's write logit a mean from
    `WRITE_OFFSET`, both read from the massive channels of `realistic_inputs` (a bias, as real layers
    read one).

    The regime, each constant and why (the q/k mean, the spread): docs/tolerances.md §1.1.
    """
    kind = cfg.mlp_kind(layer)
    if kind != "dense":
        raise ValueError("realistic_weights draws a dense layer; use make_weights for the sparse block")
    rng = np.random.default_rng(seed)
    mode = norm_mode or cfg.norm_mode or "shared"
    D, I, Hv = cfg.hidden_size, cfg.intermediate_size, cfg.num_v_heads

    def normal(*shape, scale):
        return rng.normal(0.0, scale, size=shape)

    def uniform(low, high, *shape):
        return low + (high - low) * rng.random(shape)

    def one_plus_w(n, spread):  # the stored w of a norm applied as 1 + w, with 1 + w = e^N(0, spread)
        return portable_exp(normal(n, scale=spread)) - 1.0

    K = cfg.conv_kernel
    bound = 1.0 / np.sqrt(K)
    A = round_to_common(uniform(0.01, 16.0, Hv))
    lo, hi = portable_log(np.array(LONG_MEMORY))
    memory = portable_exp(uniform(lo, hi, Hv))
    fast = np.zeros(Hv, dtype=bool)
    fast[rng.permutation(Hv)[: int(Hv * FAST_HEAD_SHARE)]] = True
    s = SPREAD
    arrays = {
        "input_layernorm.weight": round_to_common(one_plus_w(D, 0.2)),
        "linear_attn.in_proj_qkv.weight": normal(cfg.conv_dim, D, scale=s["qkv"] / np.sqrt(D)),
        "linear_attn.in_proj_z.weight": normal(cfg.value_dim, D, scale=s["z"] / np.sqrt(D)),
        "linear_attn.in_proj_a.weight": normal(Hv, D, scale=s["a"] / np.sqrt(D)),
        "linear_attn.in_proj_b.weight": normal(Hv, D, scale=s["b"] / np.sqrt(D)),
        "linear_attn.conv1d.weight": uniform(-bound, bound, cfg.conv_dim, 1, K),
        "linear_attn.dt_bias": np.where(fast, 1.0, inverse_softplus(1.0 / (memory * A))),
        "linear_attn.A_log": portable_log(A),
        "linear_attn.norm.weight": 1.0 + normal(cfg.head_v_dim if mode == "shared" else cfg.value_dim, scale=0.2),
        "linear_attn.out_proj.weight": normal(D, cfg.value_dim, scale=s["out"] / np.sqrt(cfg.value_dim)),
        "post_attention_layernorm.weight": one_plus_w(D, 0.2),
        "mlp.gate_proj.weight": normal(I, D, scale=s["mlp_in"] / np.sqrt(D)),
        "mlp.up_proj.weight": normal(I, D, scale=s["mlp_in"] / np.sqrt(D)),
        "mlp.down_proj.weight": normal(D, I, scale=s["mlp_down"] / np.sqrt(I)),
    }
    qk_rows = slice(0, 2 * cfg.key_dim)
    arrays["linear_attn.in_proj_qkv.weight"][qk_rows] *= s["qk"] / s["qkv"]
    offset = uniform(WRITE_OFFSET[0], WRITE_OFFSET[1], Hv)
    add_bias(arrays, "linear_attn.in_proj_b.weight", offset, D)
    conv = arrays["linear_attn.conv1d.weight"][qk_rows].reshape(2 * cfg.key_dim, K)
    taps = conv[:, 0].copy()
    for j in range(1, K):  # elementwise, in tap order: the same sign on every CPU (np.sum may reorder)
        taps += conv[:, j]
    qk_mean = np.zeros(cfg.conv_dim)
    qk_mean[qk_rows] = QK_MEAN * np.where(taps < 0, -1.0, 1.0)
    add_bias(arrays, "linear_attn.in_proj_qkv.weight", qk_mean, D)
    unknown = sorted(set(f32) - set(arrays))
    if unknown:
        raise ValueError(f"f32: expected names of the layer's weights, found {', '.join(unknown)}")
    arrays = {k: not_half_exact(v) if k in f32 else round_to_common(v).astype(np.float32) for k, v in arrays.items()}
    stored = {k: "F32" if k in f32 else "BF16" for k in arrays}
    return LayerWeights(arrays, stored_dtypes=stored, source=f"realistic(seed={seed})", layer=layer, config=cfg)


def not_half_exact(x) -> np.ndarray:
    """float32 values nearest to ``x``, each moved one float32 ulp away from zero where bf16 or f16
    would represent it exactly (a draw lands there with odds 2^-13 per element): every value then
    changes when a port rounds it to bf16 or to f16. Elementwise IEEE operations only (the same bits
    on every CPU)."""
    v = np.asarray(x, dtype=np.float64).astype(np.float32)
    exact = (round_to(v, "bf16") == v) | (round_to(v, "f16") == v)
    return np.where(exact, np.nextafter(v, np.copysign(np.float32(np.inf), v)), v).astype(np.float32)


def add_bias(arrays: dict, name: str, bias: np.ndarray, hidden_size: int) -> None:
    """Make the projection ``name`` add ``bias`` (one value per output row) on a token of
    :func:`realistic_inputs`, by reading the massive channels, whose size after the input norm is
    known (:func:`massive_x_norm` times the norm's ``1 + w``)."""
    w_in = np.asarray(arrays["input_layernorm.weight"], dtype=np.float64)
    channels = massive_channels(hidden_size)
    for c, sign in zip(channels, MASSIVE_SIGNS):
        size = sign * massive_x_norm(hidden_size) * (1.0 + w_in[c])
        arrays[name][:, c] = arrays[name][:, c] + np.asarray(bias) / (len(channels) * size)


def realistic_inputs(cfg: GDNConfig, batch: int, tokens: int, seed: int = 0, *, outliers: float = 0.005,
                     outlier_scale: float = 8.0) -> np.ndarray:
    """A residual stream ``[B, T, D]`` like a middle layer's, bf16/f16-exact: each token's size varies
    (RMS ``e^N(0, 0.4)``); the :func:`massive_channels`, of fixed signs, carry a share
    :data:`MASSIVE_SHARE` of each token's energy (the "massive activations" of real residual
    streams: at D = 1024 about 11 times the other channels' size); a share ``outliers`` of the other
    elements is ``outlier_scale`` times larger."""
    rng = np.random.default_rng(seed)
    D = cfg.hidden_size
    rms = portable_exp(rng.normal(0.0, 0.4, size=(batch, tokens, 1)))
    x = rng.normal(0.0, 1.0, size=(batch, tokens, D)) * rms
    if outliers > 0:
        mask = rng.random(x.shape) < outliers
        x = np.where(mask, x * outlier_scale, x)
    channels = massive_channels(D)
    size = np.sqrt(MASSIVE_SHARE * D / (len(channels) * (1.0 - MASSIVE_SHARE)))
    jitter = 1.0 + 0.1 * rng.normal(size=(batch, tokens, len(channels)))
    x[..., channels] = np.array(MASSIVE_SIGNS[: len(channels)]) * size * rms * jitter
    return round_to_common(x)


def make_inputs(
    cfg: GDNConfig,
    batch: int,
    tokens: int,
    seed: int = 0,
    *,
    scale: float = 1.0,
    outliers: float = 0.01,
    outlier_scale: float = 20.0,
) -> np.ndarray:
    """Residual-stream input ``[B, T, D]`` with a few large outliers, bf16/f16-exact."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, scale, size=(batch, tokens, cfg.hidden_size))
    if outliers > 0:
        mask = rng.random(x.shape) < outliers
        x = np.where(mask, x * outlier_scale, x)
    return round_to_common(x)


def write_hf_checkpoint(
    directory: str | os.PathLike,
    cfg: GDNConfig,
    layers: Mapping[int, Mapping[str, np.ndarray]],
    *,
    num_layers: int | None = None,
    prefix: str = "model.language_model.layers.{i}.",
    layout: str = "qwen3_5",
    dtypes: Mapping[str, str] | None = None,
    shards: int = 1,
    extra_config: Mapping | None = None,
    expert_layout: str = "per_expert",
) -> Path:
    """Write a small checkpoint in the Hugging Face layout (for tests and examples).

    ``layers`` maps layer index -> canonical weights. ``layout="qwen3_next"`` writes the fused
    ``in_proj_qkvz``/``in_proj_ba`` instead of the four separate projections. ``dtypes`` maps a
    canonical weight name to ``BF16``/``F16``/``F32`` (default ``BF16``; ``A_log`` and the gated norm
    weight ``F32`` as in Qwen3.5). ``shards > 1`` splits tensors over files with an index.
    Layers with the sparse block write their experts one by one (``expert_layout="per_expert"``,
    as checkpoints do; a dtype given for ``mlp.experts.gate_up_proj`` / ``down_proj`` applies to
    every expert's projections) or stacked (``"stacked"``, transformers' in-memory form); the
    config's ``model_type`` is ``qwen3_5_moe_text`` (every layer sparse) or ``qwen3_next``.
    """
    if expert_layout not in ("per_expert", "stacked"):
        raise ValueError(f"expert_layout must be 'per_expert' or 'stacked', found {expert_layout!r}")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    default = {"linear_attn.A_log": "F32", "linear_attn.norm.weight": "F32"}
    kinds = {**default, **dict(dtypes or {})}
    tensors: dict[str, np.ndarray] = {}
    tensor_kinds: dict[str, str] = {}
    for i, weights in sorted(layers.items()):
        w = {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()}
        if layout == "qwen3_next":
            w = _fuse_qwen3_next(cfg, w)
        if expert_layout == "per_expert" and EXPERTS_GATE_UP in w:
            w = unstack_experts(cfg, w)
        for name, arr in w.items():
            full = prefix.format(i=i) + name
            tensors[full] = arr
            tensor_kinds[full] = kinds.get(name, kinds.get(_canonical_of(name), "BF16"))
    names = sorted(tensors)
    n_layers = num_layers if num_layers is not None else max(layers) + 1
    config = cfg.to_hf()
    model_type = "qwen3_5_text" if layout == "qwen3_5" else "qwen3_next"
    if cfg.has_experts:
        all_sparse = cfg.decoder_sparse_step == 1 and not cfg.mlp_only_layers and cfg.norm_topk_prob
        model_type = "qwen3_5_moe_text" if layout == "qwen3_5" and all_sparse else "qwen3_next"
    config.update({"num_hidden_layers": n_layers, "model_type": model_type})
    if cfg.layer_types is None:
        config["layer_types"] = ["linear_attention"] * n_layers
    config.update(dict(extra_config or {}))
    write_bytes_atomic(root / "config.json", (json.dumps(config, indent=2) + "\n").encode())
    if shards <= 1:
        write_safetensors(root / "model.safetensors", tensors, {"format": "pt"},
                          dtypes={n: _st_kind(tensor_kinds[n]) for n in names})
        return root
    groups = [names[k::shards] for k in range(shards)]
    weight_map = {}
    for k, group in enumerate(groups):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(root / fname, {n: tensors[n] for n in group}, {"format": "pt"},
                          dtypes={n: _st_kind(tensor_kinds[n]) for n in group})
        weight_map.update({n: fname for n in group})
    index = {"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))}, "weight_map": weight_map}
    write_bytes_atomic(root / "model.safetensors.index.json", (json.dumps(index, indent=2) + "\n").encode())
    return root


def _st_kind(kind: str) -> str:
    return {"bf16": "BF16", "f16": "F16", "f32": "F32"}.get(kind, kind)


def _canonical_of(name: str) -> str:
    m = PER_EXPERT.match(name)
    if m:
        return EXPERTS_DOWN if m.group(2) == "down_proj" else EXPERTS_GATE_UP
    return {"linear_attn.in_proj_qkvz.weight": "linear_attn.in_proj_qkv.weight",
            "linear_attn.in_proj_ba.weight": "linear_attn.in_proj_b.weight"}.get(name, name)


def _fuse_qwen3_next(cfg: GDNConfig, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Canonical projections -> Qwen3-Next ``in_proj_qkvz`` / ``in_proj_ba`` (interleaved per key group)."""
    Hk, dk, dv, r = cfg.num_k_heads, cfg.head_k_dim, cfg.head_v_dim, cfg.head_ratio
    qkv = w.pop("linear_attn.in_proj_qkv.weight")
    z = w.pop("linear_attn.in_proj_z.weight")
    b = w.pop("linear_attn.in_proj_b.weight")
    a = w.pop("linear_attn.in_proj_a.weight")
    D = qkv.shape[1]
    q = qkv[: cfg.key_dim].reshape(Hk, dk, D)
    k = qkv[cfg.key_dim : 2 * cfg.key_dim].reshape(Hk, dk, D)
    v = qkv[2 * cfg.key_dim :].reshape(Hk, r * dv, D)
    zz = z.reshape(Hk, r * dv, D)
    w["linear_attn.in_proj_qkvz.weight"] = np.concatenate([q, k, v, zz], axis=1).reshape(-1, D)
    w["linear_attn.in_proj_ba.weight"] = np.concatenate(
        [b.reshape(Hk, r, D), a.reshape(Hk, r, D)], axis=1
    ).reshape(-1, D)
    return w


__all__ = ["CHECKPOINT_F32", "DEMO_CONFIG", "WEIGHT_NAMES", "add_bias", "inverse_softplus", "make_inputs",
           "make_weights", "massive_channels", "massive_x_norm", "not_half_exact", "realistic_inputs",
           "realistic_weights", "write_hf_checkpoint"]
