"""Load one GDN layer from a Hugging Face checkpoint directory.

Accepts one ``model.safetensors`` or shards listed in ``model.safetensors.index.json``; the layer
prefixes ``model.language_model.layers.{i}.`` (Qwen3.5 VLM checkpoints) and ``model.layers.{i}.``
(text-only, Qwen3-Next); any stored float dtype, read exactly. The Qwen3-Next fused projections
(``in_proj_qkvz``, ``in_proj_ba``, interleaved per key-head group, docs/math.md §3) are converted to
the canonical Qwen3.5 names. A layer with the sparse mixture-of-experts block reads its router,
shared expert and experts; per-expert tensors (``mlp.experts.{e}.gate_proj|up_proj|down_proj.weight``,
as checkpoints store them) are stacked into transformers' in-memory form (:mod:`gdncheck.experts`),
and a checkpoint already in that form is read as is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .config import GDNConfig
from .errors import CheckpointError, LayerIndexError, ProjectionSizeError
from .experts import PER_EXPERT, stack_experts
from .safetensors_io import SafetensorsFile
from .untrusted import UnsafePathError, safe_path
from .weights import LayerWeights, check_projection_layout, layer_weight_names, validate_weights

PREFIXES = ("model.language_model.layers.{i}.", "model.layers.{i}.")
FUSED_QKVZ = "linear_attn.in_proj_qkvz.weight"
FUSED_BA = "linear_attn.in_proj_ba.weight"
#: Largest config.json or index gdncheck reads (real ones are a few kB to a few MB).
MAX_JSON_BYTES = 64 * 1024 * 1024


def _read_json(path: Path, what: str):
    """A JSON document of the checkpoint, or a :class:`CheckpointError` naming the file and why not."""
    try:
        if not path.is_file():
            raise CheckpointError(f"expected {what} {path}, found " + ("a folder" if path.is_dir() else "nothing"))
        if path.stat().st_size > MAX_JSON_BYTES:
            raise CheckpointError(f"{path}: {path.stat().st_size} bytes, more than the {MAX_JSON_BYTES} a {what} may "
                                  f"have")
        return json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise CheckpointError(f"{path} is not usable JSON: nested too deep") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None


def read_config(checkpoint_dir: str | os.PathLike) -> GDNConfig:
    path = Path(checkpoint_dir) / "config.json"
    if not path.exists():
        raise CheckpointError(f"expected a Hugging Face config.json in {Path(checkpoint_dir)}, found none")
    return GDNConfig.from_hf(_read_json(path, "a Hugging Face config.json"))


def _weight_map(root: Path) -> dict[str, Path]:
    index = root / "model.safetensors.index.json"
    if index.exists():
        doc = _read_json(index, "a checkpoint index")
        wm = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
            found = type(wm).__name__ if isinstance(doc, dict) else type(doc).__name__
            raise CheckpointError(f"{index}: expected a JSON object whose 'weight_map' maps tensor names to shard "
                                  f"file names, found {found}")
        out = {}
        for name, file in wm.items():
            try:
                out[name] = safe_path(root, file, f"shard of {name!r}")
            except UnsafePathError as exc:
                raise CheckpointError(f"{index}: {exc}") from None
        return out
    single = root / "model.safetensors"
    files = [single] if single.exists() else sorted(root.glob("*.safetensors"))
    if not files:
        raise CheckpointError(
            f"expected model.safetensors or model.safetensors.index.json in {root}, found neither"
        )
    out = {}
    for f in files:
        try:
            f = safe_path(root, f.name, "checkpoint file")
        except UnsafePathError as exc:
            raise CheckpointError(str(exc)) from None
        for name in SafetensorsFile(f):
            out[name] = f
    return out


def load_layer(
    checkpoint_dir: str | os.PathLike, layer: int, config: GDNConfig | None = None
) -> LayerWeights:
    """The weights of GDN layer ``layer``, by canonical name (prefix removed), validated.

    The layer's MLP block (dense or sparse) follows the config (:meth:`GDNConfig.mlp_kind`). The
    returned :class:`LayerWeights` carries the config it was validated against (``.config``).
    """
    root = Path(checkpoint_dir)
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise LayerIndexError(f"expected a layer index (a non-negative integer), found {layer!r}")
    if not root.is_dir():
        raise CheckpointError(f"expected a checkpoint directory, found nothing at {root}")
    cfg = config or read_config(root)
    cfg.check_linear_layer(layer)
    moe = cfg.mlp_kind(layer) == "moe"
    wmap = _weight_map(root)
    prefix = None
    for pattern in PREFIXES:
        p = pattern.format(i=layer)
        if any(name.startswith(p) for name in wmap):
            prefix = p
            break
    if prefix is None:
        found = sorted({".".join(n.split(".")[:-3]) for n in wmap if ".layers." in n})[:3]
        raise CheckpointError(
            f"expected tensors under {' or '.join(p.format(i=layer) for p in PREFIXES)}, found none "
            f"(layer prefixes present: {', '.join(found) or 'none'})",
            layer=layer,
        )
    wanted = set(layer_weight_names(cfg, layer)) | {FUSED_QKVZ, FUSED_BA}
    arrays: dict[str, np.ndarray] = {}
    stored: dict[str, str] = {}
    open_files: dict[Path, SafetensorsFile] = {}
    for full, file in wmap.items():
        if not full.startswith(prefix):
            continue
        name = full[len(prefix):]
        if name not in wanted and not (moe and PER_EXPERT.match(name)):
            continue
        if file not in open_files:
            open_files[file] = SafetensorsFile(file)
        st = open_files[file]
        if full not in st:
            raise CheckpointError(f"index lists {full!r} in {file.name}, but that file does not hold it", layer=layer)
        arrays[name] = st.read(full)
        stored[name] = st.dtype_of(full)
    check_projection_layout(arrays, layer)  # both layouts at once: which to use would be a guess
    if FUSED_QKVZ in arrays or FUSED_BA in arrays:
        _unfuse_qwen3_next(cfg, arrays, stored, layer)
    if moe:
        stack_experts(cfg, arrays, stored, layer)
    weights = LayerWeights(arrays, stored_dtypes=stored, layer=layer, source=str(root), config=cfg)
    validate_weights(cfg, weights, layer=layer)
    return weights


def _unfuse_qwen3_next(cfg: GDNConfig, arrays: dict, stored: dict, layer: int) -> None:
    """Qwen3-Next ``in_proj_qkvz``/``in_proj_ba`` -> canonical ``in_proj_{qkv,z,a,b}`` (in place)."""
    Hk, dk, dv, r = cfg.num_k_heads, cfg.head_k_dim, cfg.head_v_dim, cfg.head_ratio
    if FUSED_QKVZ in arrays:
        w = arrays.pop(FUSED_QKVZ)
        kind = stored.pop(FUSED_QKVZ)
        rows = 2 * cfg.key_dim + 2 * cfg.value_dim
        if w.ndim != 2 or w.shape[0] != rows:
            raise ProjectionSizeError(
                f"expected in_proj_qkvz rows {Hk} groups x [q {dk}, k {dk}, v {r * dv}, z {r * dv}] = {rows}, "
                f"found shape {list(w.shape)}",
                layer=layer, name=FUSED_QKVZ,
            )
        g = w.reshape(Hk, 2 * dk + 2 * r * dv, w.shape[1])
        q, k = g[:, :dk], g[:, dk : 2 * dk]
        v, z = g[:, 2 * dk : 2 * dk + r * dv], g[:, 2 * dk + r * dv :]
        D = w.shape[1]
        arrays["linear_attn.in_proj_qkv.weight"] = np.concatenate(
            [q.reshape(-1, D), k.reshape(-1, D), v.reshape(-1, D)], axis=0
        )
        arrays["linear_attn.in_proj_z.weight"] = np.ascontiguousarray(z.reshape(-1, D))
        stored["linear_attn.in_proj_qkv.weight"] = stored["linear_attn.in_proj_z.weight"] = kind
    if FUSED_BA in arrays:
        w = arrays.pop(FUSED_BA)
        kind = stored.pop(FUSED_BA)
        if w.ndim != 2 or w.shape[0] != 2 * cfg.num_v_heads:
            raise ProjectionSizeError(
                f"expected in_proj_ba rows {Hk} groups x [b {r}, a {r}] = {2 * cfg.num_v_heads}, "
                f"found shape {list(w.shape)}",
                layer=layer, name=FUSED_BA,
            )
        g = w.reshape(Hk, 2 * r, w.shape[1])
        arrays["linear_attn.in_proj_b.weight"] = np.ascontiguousarray(g[:, :r].reshape(-1, w.shape[1]))
        arrays["linear_attn.in_proj_a.weight"] = np.ascontiguousarray(g[:, r:].reshape(-1, w.shape[1]))
        stored["linear_attn.in_proj_b.weight"] = stored["linear_attn.in_proj_a.weight"] = kind
