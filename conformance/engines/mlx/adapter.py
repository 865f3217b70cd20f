"""Apple MLX (mlx-lm) as a port: ``gdncheck run gdncheck.conformance.engines.mlx.adapter:mlx --profile f32|bf16``.

A factory of the port contract (:mod:`gdncheck.harness.contract`) around mlx-lm's own Qwen3.5 layer
(``qwen3_5`` / ``qwen3_5_moe`` ``DecoderLayer``, its ``ArraysCache``), on MLX's device: glue only, mlx-lm's code
does the math.

What it exposes, what it cannot and why, the engine versions it knows: conformance/engines/mlx/README.md.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.errors import GDNError
from gdncheck.harness import NotApplicable, is_strict, serving_ops

log = logging.getLogger("gdncheck.ports.mlx")

#: the versions this adapter was written and tested against: (mlx, mlx-lm)
TESTED = ("0.32.4", "0.32.2")
NOT_INSTALLED = ("implementation 'mlx' needs mlx and mlx-lm, not installed here: "
                 "pip install \"mlx[cpu]\" mlx-lm")
#: the profiles it runs in, and the MLX dtype of each
PROFILE_DTYPES = {"f32": "float32", "bf16": "bfloat16"}
#: weights Qwen3.5 checkpoints store in float32 (FORMAT.md §3): kept so in every profile, as mlx-lm loads them
FLOAT32_WEIGHTS = ("linear_attn.A_log", "linear_attn.norm.weight")
PREFIX = "model.language_model.layers.0."
_warned: set[str] = set()


class MLXRefused(Exception):  # noqa: N818 - carries the code of what MLX refused
    """MLX raised; ``code`` is the FORMAT.md §6 code it stands for."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Engine:
    """The MLX modules the adapter drives."""

    mx: Any
    nn: Any
    qwen3_5: Any
    qwen3_5_moe: Any
    gated_delta: Any
    base: Any
    mlx_version: str
    mlx_lm_version: str


#: what the glue reads in mlx-lm's modules (module -> attributes)
_NEEDED = {"qwen3_5": ("mx", "DecoderLayer", "TextModelArgs", "Model", "ModelArgs", "normalize_qk",
                       "gated_delta_update"),
           "gated_delta": ("gated_delta_ops", "gated_delta_kernel", "compute_g"),
           "qwen3_5_moe": ("Model", "ModelArgs")}


def engine() -> Engine:
    """Import MLX and mlx-lm, or say in one line that they are not installed."""
    try:
        mx = importlib.import_module("mlx.core")
        nn = importlib.import_module("mlx.nn")
        mlx_lm = importlib.import_module("mlx_lm")
        mods = {name: importlib.import_module(f"mlx_lm.models.{name}")
                for name in ("qwen3_5", "qwen3_5_moe", "gated_delta", "base")}
    except ImportError:
        raise GDNError(NOT_INSTALLED) from None
    for mod, names in _NEEDED.items():
        missing = [n for n in names if not hasattr(mods[mod], n)]
        if missing:
            raise GDNError(f"implementation 'mlx' drives mlx-lm {TESTED[1]}'s internals; mlx-lm "
                           f"{mlx_lm.__version__} has no {', '.join(missing)} in mlx_lm.models.{mod}")
    versions = (str(mx.__version__), str(getattr(mlx_lm, "__version__", "?")))
    for name, found, tested in zip(("mlx", "mlx-lm"), versions, TESTED):
        if found.split(".")[:2] != tested.split(".")[:2] and name not in _warned:
            _warned.add(name)
            log.warning("implementation 'mlx' was tested with %s %s, found %s: a changed internal layout shows "
                        "as a failure at its stage", name, tested, found)
    return Engine(mx, nn, mods["qwen3_5"], mods["qwen3_5_moe"], mods["gated_delta"], mods["base"], *versions)


# --- what MLX can be asked ----------------------------------------------------------------------------
def _text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The case's Hugging Face config as mlx-lm's text config of a one-layer model (layer 0 linear)."""
    text = dict(config)
    sparse = (text.get("num_experts") or 0) > 0
    text.update(model_type="qwen3_5_moe_text" if sparse else "qwen3_5_text", num_hidden_layers=1,
                vocab_size=16, full_attention_interval=max(2, int(text.get("full_attention_interval") or 4)))
    return text


def _model(eng: Engine, config: Mapping[str, Any]):
    """mlx-lm's own ``Model`` (``qwen3_5``, or ``qwen3_5_moe`` for a sparse config), one layer."""
    text = _text_config(config)
    module = eng.qwen3_5_moe if (text.get("num_experts") or 0) > 0 else eng.qwen3_5
    args = module.ModelArgs.from_dict({"model_type": text["model_type"].removesuffix("_text"), "text_config": text})
    return module.Model(args)


def check_case(config: Mapping[str, Any], program: list[Mapping[str, Any]]) -> None:
    """Called before gdncheck parses the config: what MLX cannot be asked at all, and the configuration
    errors MLX itself refuses (or accepts)."""
    serving = serving_ops(program)
    if serving:
        raise NotApplicable(f"the serving patterns ({', '.join(serving)}; docs/serving.md) are not an mlx-lm "
                            "layer feature: qwen3_5.DecoderLayer takes [B, T, D] batches with one ArraysCache row per "
                            "batch row (no packed cu_seqlens stream, no slot indices into a state pool, no per-token "
                            "states kept for a speculative commit)")
    if is_strict(program):
        raise NotApplicable("strict mode (raise seq_pos_mismatch instead of resetting) is not an mlx-lm feature: "
                            "its ArraysCache keeps no sequence position")
    try:
        GDNConfig.from_hf(dict(config))
    except GDNError as exc:
        eng = engine()
        try:
            _model(eng, config)
        except Exception as mlx_exc:  # noqa: BLE001 - whatever MLX raises building its layer is its refusal
            msg = str(mlx_exc)
            code = config_refusal_code(msg)
            raise MLXRefused(code, f"mlx-lm refused the configuration: {type(mlx_exc).__name__}: {msg}") from None
        raise NotApplicable(
            f"mlx-lm's TextModelArgs accepts this configuration without a check ({exc.code}: {exc}); only "
            "gdncheck's own parser refuses it, which says nothing about MLX"
            + (" (a missing head setting silently takes its dataclass default)" if exc.code == "missing_head_setting"
               else "")) from None


def mlx(cfg: GDNConfig, weights, *, profile: str = "f32", strict: bool = False, **options) -> MLXLayer:
    """The plug-in factory of implementation ``mlx``."""
    if options:
        raise GDNError(f"mlx: unknown option(s) {', '.join(sorted(options))}; it takes none")
    if profile not in PROFILE_DTYPES:
        raise GDNError(f"implementation 'mlx' runs in profile {', '.join(PROFILE_DTYPES)}, found {profile!r}")
    if strict:  # check_case refuses strict programs first; a direct caller gets the same answer
        raise NotApplicable("strict mode is not an mlx-lm feature: its ArraysCache keeps no sequence position")
    eng = engine()
    _check_expressible(eng, cfg, weights, profile)
    return MLXLayer(eng, cfg, weights, profile)


mlx.check_case = check_case


def _check_expressible(eng: Engine, cfg: GDNConfig, weights, profile: str) -> None:
    norm = weights.get("linear_attn.norm.weight")
    if norm is not None:
        size = int(np.size(norm))
        if size == cfg.value_dim and cfg.value_dim != cfg.head_v_dim:
            raise NotApplicable(f"per_head gated norm ({size} = Hv·dv weights): mlx-lm's Qwen3NextRMSNormGated has "
                                f"one [dv = {cfg.head_v_dim}] weight shared by every head")
        if cfg.norm_mode is not None and (cfg.norm_mode != "shared" or size != cfg.head_v_dim):
            raise NotApplicable(f"the config declares linear_norm_mode={cfg.norm_mode!r}, a setting mlx-lm does not "
                                "have (it neither reads nor checks it)")


def _check_runnable(eng: Engine, cfg: GDNConfig, profile: str) -> None:
    """After MLX accepted the weights: what its backend cannot run in this profile."""
    if cfg.mlp_kind(0) == "moe":
        problem = _gather_mm_problem(eng, PROFILE_DTYPES[profile])
        if problem:
            raise NotApplicable(f"the sparse block in {profile} on MLX's {eng.mx.default_device()} backend: "
                                f"SwitchGLU's expert matmuls run mx.gather_mm, which refuses {profile} there "
                                f"({problem})")


@functools.cache
def _gather_mm_problem(eng: Engine, dtype: str) -> str | None:
    """Why ``mx.gather_mm`` (SwitchLinear's matmul) does not run in ``dtype`` on the default device, or None."""
    mx = eng.mx
    dt = getattr(mx, dtype)
    try:
        mx.eval(mx.gather_mm(mx.zeros((1, 1, 1, 2), dtype=dt), mx.zeros((2, 2, 2), dtype=dt),
                             rhs_indices=mx.array([[0]], dtype=mx.uint32)))
    except (RuntimeError, ValueError) as exc:
        return str(exc)
    return None


def config_refusal_code(message: str) -> str:
    """The FORMAT.md §6 code of what MLX raised building its layer from a configuration: ``GatedDeltaNet``'s
    head-ratio check, ``nn.RMSNorm``'s eps check, else the family ``config_error`` (a crash such as a
    ZeroDivisionError from a zero-sized default is a refusal too, but names no check)."""
    if "must be divisible" in message:
        return "head_ratio"
    if "'eps' must be positive" in message:
        return "invalid_eps"
    return "config_error"


_SHAPE = re.compile(r"Expected shape \(([\d, ]*)\) but received shape \(([\d, ]*)\) for parameter ([\w.]+)")


def refusal_code(message: str) -> str:
    """The FORMAT.md §6 code of a ``load_weights`` refusal, from the parameter MLX names."""
    if message.startswith("Missing"):
        return "missing_weight"
    m = _SHAPE.search(message)
    if not m:
        return "weight_error"
    want = [int(v) for v in m.group(1).split(",") if v.strip()]
    found = [int(v) for v in m.group(2).split(",") if v.strip()]
    name = m.group(3)
    if name == "linear_attn.norm.weight":
        return "norm_weight_size"
    if name == "linear_attn.conv1d.weight" and len(found) == len(want) and found[0] == want[0]:
        return "conv_kernel_mismatch"
    if name in ("linear_attn.in_proj_qkv.weight", "linear_attn.conv1d.weight"):
        return "projection_size"
    return "weight_shape"


# --- the glue: weights in, states out -------------------------------------------------------------------
def checkpoint(eng: Engine, weights, profile: str) -> dict[str, Any]:
    """The layer's weights as the checkpoint mlx-lm would read: Hugging Face names under ``PREFIX``, MLX
    arrays in the stored dtype (the profile's; ``FLOAT32_WEIGHTS`` in float32)."""
    mx = eng.mx
    dtype = getattr(mx, PROFILE_DTYPES[profile])
    out = {}
    for name, value in weights.items():
        arr = mx.array(np.ascontiguousarray(np.asarray(value, dtype=np.float32)))
        out[PREFIX + name] = arr if name in FLOAT32_WEIGHTS else arr.astype(dtype)
    return out


def sanitize(model, ckpt: dict[str, Any]) -> dict[str, Any]:
    """mlx-lm's own ``Model.sanitize`` (conv layout, ``1 + w`` folded, experts split)."""
    return model.sanitize(dict(ckpt))


def recurrent_to_format(S: np.ndarray) -> np.ndarray:
    """MLX's ``[B, Hv, dv, dk]`` recurrent state as FORMAT.md §5's ``[B, Hv, dk, dv]``."""
    return np.swapaxes(S, -1, -2)


def conv_to_format(oldest: np.ndarray, cached: np.ndarray) -> np.ndarray:
    """``[B, conv_dim, K]`` from the conv window's oldest column [B, conv_dim] and MLX's K-1 cached columns
    ``[B, K-1, conv_dim]`` (oldest first)."""
    return np.concatenate([oldest[:, :, None], np.swapaxes(cached, 1, 2)], axis=2)


def query_to_format(q: np.ndarray, head_k_dim: int) -> np.ndarray:
    """The query MLX hands its rule, ``dk^-1/2 · q/‖q‖``, as FORMAT's unscaled normalised ``q``."""
    return np.asarray(q, dtype=np.float64) * math.sqrt(head_k_dim)


def to_numpy(eng: Engine, value: Any) -> np.ndarray:
    """A NumPy copy of an MLX array (bf16/f16 widened to float32, exactly)."""
    mx = eng.mx
    if value.dtype in (mx.bfloat16, mx.float16):
        value = value.astype(mx.float32)
    return np.array(value, copy=True)


# --- recording ------------------------------------------------------------------------------------------
def _tap_class(nn):
    class _Tap(nn.Module):
        """A submodule wrapper recording what it is called with and returns, while a call is recorded."""

        def __init__(self, inner, tracer: Tracer, path: str):
            super().__init__()
            self.inner = inner
            self.tap_tracer = tracer
            self.tap_path = path

        def __call__(self, *args, **kwargs):
            out = self.inner(*args, **kwargs)
            self.tap_tracer.module_called(self.tap_path, args, out)
            return out

    return _Tap


#: submodule path -> the stage tensor its output is
MODULE_OUTPUTS = {
    "input_layernorm": "x_norm",
    "linear_attn.in_proj_qkv": "qkv",
    "linear_attn.in_proj_z": "z",
    "linear_attn.in_proj_a": "a",
    "linear_attn.in_proj_b": "b",
    "linear_attn.norm": "core_gated",
    "linear_attn.out_proj": "attn_out",
    "post_attention_layernorm": "h_norm",
    "mlp": "mlp_out",
}
#: submodule path -> the stage tensor its first input is
MODULE_INPUTS = {"post_attention_layernorm": "h"}
#: submodules of the sparse block (outputs, except switch_mlp: its indices argument)
MOE_MODULES = {"mlp.gate": "router_logits", "mlp.switch_mlp": "selected_experts",
               "mlp.shared_expert": "shared_expert", "mlp.shared_expert_gate": "shared_gate_logit"}
RULE_FUNCTIONS = ("gated_delta_ops", "gated_delta_kernel")


class _MxProxy:
    """``mlx.core`` for ``mlx_lm.models.qwen3_5`` while a call runs: every name is MLX's own; ``concatenate``
    and ``split`` also record their operands (the conv window, the conv output)."""

    def __init__(self, mx, rec: Recording):
        self._mx, self._rec = mx, rec

    def __getattr__(self, name):
        return getattr(self._mx, name)

    def concatenate(self, arrays, *args, **kwargs):
        out = self._mx.concatenate(arrays, *args, **kwargs)
        if out.ndim == 3 and out.shape[-1] == self._rec.cfg.conv_dim and "conv_window" not in self._rec.raw:
            self._rec.raw["conv_window"] = out
        return out

    def split(self, a, *args, **kwargs):
        if a.ndim == 3 and a.shape[-1] == self._rec.cfg.conv_dim and "qkv_conv" not in self._rec.raw:
            self._rec.raw["qkv_conv"] = a
        return self._mx.split(a, *args, **kwargs)


@dataclass
class Recording:
    cfg: GDNConfig
    raw: dict[str, Any] = field(default_factory=dict)
    called: list[str] = field(default_factory=list)


class Tracer:
    """Taps on the decoder layer's submodules (installed once) and the recording module globals (installed
    for one call at a time)."""

    def __init__(self, eng: Engine, layer, cfg: GDNConfig, sparse: bool):
        self.eng, self.layer, self.cfg = eng, layer, cfg
        self.calls: list[dict] = []
        self._rec: Recording | None = None
        Tap = _tap_class(eng.nn)
        paths = list(dict.fromkeys([*MODULE_OUTPUTS, *MODULE_INPUTS, *(MOE_MODULES if sparse else ())]))
        for path in sorted(paths, key=lambda p: -p.count(".")):  # innermost first
            parent_path, _, name = path.rpartition(".")
            parent = self._submodule(parent_path)
            setattr(parent, name, Tap(getattr(parent, name), self, path))

    def _submodule(self, path: str):
        mod = self.layer
        for part in filter(None, path.split(".")):
            mod = getattr(mod, part)
        return mod

    def module_called(self, path: str, args, out) -> None:
        rec = self._rec
        if rec is None:
            return
        if path in MODULE_OUTPUTS:
            rec.raw[MODULE_OUTPUTS[path]] = out
        if path in MODULE_INPUTS:
            rec.raw[MODULE_INPUTS[path]] = args[0]
        if path == "mlp.switch_mlp":
            rec.raw["selected_experts"] = args[1]
        elif path in MOE_MODULES:
            rec.raw[MOE_MODULES[path]] = out

    def _rule(self, name: str, fn):
        rec = self._rec

        def rule(q, k, v, g, beta, state=None, mask=None):
            y, new_state = fn(q, k, v, g, beta, state, mask)
            rec.called.append(name)
            rec.raw.update(q=q, k=k, v=v, beta=beta, core=y, recurrent_state=new_state)
            return y, new_state
        return rule

    @contextlib.contextmanager
    def recording(self, T: int):
        """Capture one call: yields its :class:`Recording`; mlx-lm's module globals are restored after."""
        self._rec = rec = Recording(self.cfg)
        q35, gd = self.eng.qwen3_5, self.eng.gated_delta
        saved_mx = q35.mx
        saved = {name: getattr(gd, name) for name in RULE_FUNCTIONS}
        try:
            q35.mx = _MxProxy(saved_mx, rec)
            for name, fn in saved.items():
                setattr(gd, name, self._rule(name, fn))
            yield rec
        finally:
            q35.mx = saved_mx
            for name, fn in saved.items():
                setattr(gd, name, fn)
            self.calls.append({"T": T, "functions": list(rec.called)})
            self._rec = None


# --- the implementation ---------------------------------------------------------------------------------
@dataclass
class MLXState:
    """mlx-lm's ``ArraysCache`` (``[conv_state [B, K-1, conv_dim], recurrent_state [B, Hv, dv, dk]]``), the
    oldest column of the last conv window (what §5's conv_state holds and the cache drops), and the positions
    the adapter has fed it (to tell when a call asks for the seq-len rule, which MLX does not have)."""

    cache: Any
    oldest: Any  # mx.array [B, conv_dim] or None (a zero state)
    seq_len: np.ndarray


class MLXLayer:
    """An :class:`~gdncheck.harness.Implementation` driving mlx-lm's ``qwen3_5.DecoderLayer``."""

    def __init__(self, eng: Engine, cfg: GDNConfig, weights, profile: str):
        self.eng, self.cfg, self.profile = eng, cfg, profile
        mx = eng.mx
        self.dtype = getattr(mx, PROFILE_DTYPES[profile])
        self.sparse = cfg.mlp_kind(0) == "moe"
        self.model = _model(eng, self._config(cfg))
        layer = self.model.layers[0]
        if not getattr(layer, "is_linear", False):
            raise GDNError("mlx-lm built layer 0 as a full-attention layer")
        params = sanitize(self.model, checkpoint(eng, weights, profile))
        prefix = "language_model.model.layers.0."
        try:
            layer.load_weights([(k[len(prefix):], v) for k, v in params.items() if k.startswith(prefix)],
                               strict=True)
        except ValueError as exc:
            msg = str(exc)
            raise MLXRefused(refusal_code(msg), f"mlx-lm refused the weights: {msg}") from None
        _check_runnable(eng, cfg, profile)
        layer.eval()
        mx.eval(layer.parameters())
        self.layer = layer
        self.tracer = Tracer(eng, layer, cfg, self.sparse)
        self.name = (f"mlx-lm {eng.mlx_lm_version} {type(self.model).__module__.rsplit('.', 1)[-1]}.DecoderLayer "
                     f"({profile}, mlx {eng.mlx_version}, {mx.default_device()})")

    @staticmethod
    def _config(cfg: GDNConfig) -> dict[str, Any]:
        """The config mlx-lm is built from: the case's, as parsed (the parser has run; check_case asked MLX
        about the ones it refuses)."""
        c = {"hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
             "rms_norm_eps": cfg.rms_norm_eps, "linear_num_key_heads": cfg.num_k_heads,
             "linear_num_value_heads": cfg.num_v_heads, "linear_key_head_dim": cfg.head_k_dim,
             "linear_value_head_dim": cfg.head_v_dim, "linear_conv_kernel_dim": cfg.conv_kernel,
             "hidden_act": "silu"}
        if cfg.mlp_kind(0) == "moe":
            c.update(num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
                     moe_intermediate_size=cfg.moe_intermediate_size,
                     shared_expert_intermediate_size=cfg.shared_expert_intermediate_size,
                     norm_topk_prob=bool(cfg.norm_topk_prob))
        return c

    # --- state -------------------------------------------------------------------------------------------
    def new_state(self, batch: int) -> MLXState:
        cache = self.model.make_cache()[0]  # mlx-lm's own: ArraysCache(size=2) for a linear layer
        return MLXState(cache, None, np.zeros(batch, dtype=np.int64))

    def state_arrays(self, state: MLXState) -> dict[str, Any]:
        """The cache's own arrays in §5's layouts; zeros (of the shapes MLX starts from) before its first call."""
        cfg, B, eng = self.cfg, len(state.seq_len), self.eng
        conv_cached, rec = state.cache[0], state.cache[1]
        if conv_cached is None:
            conv = np.zeros((B, cfg.conv_dim, cfg.conv_kernel), dtype=np.float32)
        else:
            conv = conv_to_format(to_numpy(eng, state.oldest), to_numpy(eng, conv_cached))
        if rec is None:
            S = np.zeros((B, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim), dtype=np.float32)
        else:
            S = recurrent_to_format(to_numpy(eng, rec))
        return {"conv_state": np.ascontiguousarray(conv), "recurrent_state": np.ascontiguousarray(S)}

    def snapshot(self, state: MLXState) -> MLXState:
        """MLX arrays are immutable and the layer replaces the cache's entries: a new ArraysCache holding the
        same arrays is an independent copy."""
        cache = self.model.make_cache()[0]
        cache.state = (list(state.cache.cache), state.cache.left_padding, state.cache.lengths)
        return MLXState(cache, state.oldest, state.seq_len.copy())

    def restore(self, state: MLXState, snap: MLXState) -> None:
        copy = self.snapshot(snap)
        state.cache, state.oldest, state.seq_len = copy.cache, copy.oldest, copy.seq_len

    def save_snapshot(self, snap: MLXState, path: str) -> None:
        raise NotApplicable("snapshot files: mlx-lm's save_prompt_cache writes its own layout (K-1 conv columns, a "
                            "[Hv, dv, dk] state, no sequence length), not the snapshot file of FORMAT.md §7")

    def load_snapshot(self, path: str) -> MLXState:
        raise NotApplicable("snapshot files: mlx-lm's load_prompt_cache reads its own layout, not FORMAT.md §7's")

    # --- forward -----------------------------------------------------------------------------------------
    def forward(self, x: np.ndarray, state: MLXState, seq_pos: np.ndarray):
        eng, mx = self.eng, self.eng.mx
        seq_pos = np.asarray(seq_pos, dtype=np.int64)
        moved = np.flatnonzero(state.seq_len != seq_pos)
        if moved.size:
            b = int(moved[0])
            raise NotApplicable(
                f"the seq-len rule: row {b} is called at position {int(seq_pos[b])} but its state holds "
                f"{int(state.seq_len[b])} tokens; docs/spec.md §4 resets that row to zeros, mlx-lm's ArraysCache "
                "keeps no position and resets no row")
        xt = mx.array(np.ascontiguousarray(x))
        if mx.issubdtype(xt.dtype, mx.floating):
            xt = xt.astype(self.dtype)
        T = int(x.shape[1]) if x.ndim >= 2 else 0
        with self.tracer.recording(T) as rec:
            try:
                mask = eng.base.create_ssm_mask(xt, state.cache)
                out = self.layer(xt, mask=mask, cache=state.cache)
                mx.eval(out, state.cache.cache, list(rec.raw.values()))
            except (RuntimeError, ValueError, TypeError, IndexError) as exc:
                raise MLXRefused("input_error", f"MLX raised {type(exc).__name__} on the input of shape "
                                                f"{list(x.shape)} and dtype {x.dtype}: {exc}") from None
        K = self.cfg.conv_kernel
        window = rec.raw.get("conv_window")
        state.oldest = window[:, window.shape[1] - K, :] if window is not None else None
        state.seq_len = seq_pos + T
        return to_numpy(eng, out), self._trace(rec, x.shape)

    def _trace(self, rec: Recording, shape) -> dict[str, np.ndarray]:
        eng, cfg, raw = self.eng, self.cfg, rec.raw
        B, T = int(shape[0]), int(shape[1])
        out = {name: to_numpy(eng, raw[name]) for name in
               ("x_norm", "qkv", "a", "b", "qkv_conv", "k", "v", "beta", "core", "core_gated", "attn_out", "h",
                "h_norm", "mlp_out", "router_logits") if name in raw}
        if "z" in raw:
            out["z"] = to_numpy(eng, raw["z"]).reshape(B, T, cfg.num_v_heads, cfg.head_v_dim)
        if "core_gated" in out:
            out["core_gated"] = out["core_gated"].reshape(B, T, cfg.num_v_heads, cfg.head_v_dim)
        if "q" in raw:
            out["q"] = query_to_format(to_numpy(eng, raw["q"]), cfg.head_k_dim)
        if "selected_experts" in raw:
            out["selected_experts"] = np.array(raw["selected_experts"], dtype=np.int64)
        if "shared_expert" in raw and "shared_gate_logit" in raw:  # the block's mx.sigmoid(gate) * shared
            shared = eng.mx.sigmoid(raw["shared_gate_logit"]) * raw["shared_expert"]
            out["shared_out"] = to_numpy(eng, shared)
        return out

    @property
    def calls(self) -> list[dict]:
        """Which MLX rule each forward called (newest last): for the tests and the curious."""
        return self.tracer.calls
