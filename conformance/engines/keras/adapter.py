"""keras-hub as a port: ``gdncheck run keras --profile f32|bf16``.

A factory of the port contract (:mod:`gdncheck.harness.contract`) around keras-hub's own
``Qwen3_5TransformerDecoder(layer_type="linear_attention")`` — input norm, the gated delta net with its conv and
recurrent cache, the gated norm, the SwiGLU MLP — on Keras 3's torch backend, called through its cache interface
(``call_and_update_cache``), so keras-hub picks its own paths (its chunked rule for a prefill, its recurrent rule for
one token). The stage tensors are what keras-hub computes, read where its sub-layers and rule functions hand them
on, only reshaped. What it cannot express is ``NotApplicable`` with the reason.

Design, weights mapping and findings: conformance/engines/keras/README.md.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.env import blas_threads
from gdncheck.errors import GDNError
from gdncheck.harness import NotApplicable, is_strict, serving_ops

TESTED = ("0.32.0", "3.15.1")  # keras-hub, keras
INSTALL = "pip install keras && pip install --no-deps keras-hub==0.32.0"
PROFILES = {"f32": "float32", "bf16": "bfloat16"}
#: the sub-layers of the decoder (and of its gated delta net) whose outputs are stage tensors
_OUTPUTS = {"_input_layernorm": "x_norm", "in_proj_qkv": "qkv", "in_proj_z": "z", "in_proj_a": "a", "in_proj_b": "b",
            "out_proj": "attn_out", "_post_attention_layernorm": "h_norm", "_feedforward_output_dense": "mlp_out"}
#: ... and whose inputs are: out_proj reads the gated norm's output, the post-attention norm reads h
_INPUTS = {"out_proj": "core_gated", "_post_attention_layernorm": "h"}


class KerasRefused(Exception):  # noqa: N818 - carries the code of what keras-hub refused
    """keras-hub (Keras) raised; ``code`` is the FORMAT.md §6 code it stands for."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def refusal_code(name: str, found: tuple[int, ...], want: tuple[int, ...]) -> str:
    """The FORMAT.md §6 code of Keras refusing ``name``'s value (its shape ``found``, the variable's ``want``)."""
    if name == "linear_attn.norm.weight":
        return "norm_weight_size"
    if name == "linear_attn.conv1d.weight" and found[:-1] == want[:-1]:
        return "conv_kernel_mismatch"
    if name in ("linear_attn.in_proj_qkv.weight", "linear_attn.conv1d.weight"):
        return "projection_size"
    return "weight_shape"


def check_case(config: Mapping[str, Any], program: list[Mapping[str, Any]]) -> None:
    """Called before gdncheck parses the config: what keras-hub cannot be asked at all."""
    serving = serving_ops(program)
    if serving:
        raise NotApplicable(f"the serving patterns ({', '.join(serving)}; docs/serving.md) are not a keras-hub "
                            "feature: its decoder takes [B, T, D] batches with one cache row per batch row")
    if is_strict(program):
        raise NotApplicable("strict mode (raise seq_pos_mismatch instead of resetting) is not a keras-hub feature: "
                            "its linear-attention cache keeps no sequence position")
    if config.get("num_experts") is not None:
        raise NotApplicable("a sparse (MoE) layer: keras-hub's Qwen3_5Moe decoder is another class "
                            "(qwen3_5_moe/), not wired in this adapter")
    try:
        GDNConfig.from_hf(dict(config))
    except GDNError as exc:
        raise NotApplicable(f"keras-hub's Qwen3_5TransformerDecoder takes its sizes as arguments without a check "
                            f"({exc.code}: {exc}); only gdncheck's own parser refuses this configuration") from None


def keras(cfg: GDNConfig, weights, *, profile: str = "f32", strict: bool = False,
          impl_class: type[KerasLayer] | None = None) -> KerasLayer:
    """The plug-in factory of implementation ``keras`` (keras-hub on Keras 3's torch backend).

    ``impl_class`` (not an ``--option``): a subclass with other glue, for the tests' mutants."""
    if profile not in PROFILES:
        raise NotApplicable(f"profile {profile}: keras-hub's decoder runs under a dtype policy of float32 or "
                            "bfloat16 (the profiles it is judged in: f32, bf16)")
    if strict:
        raise NotApplicable("strict mode is not a keras-hub feature")
    if cfg.mlp_kind(0) == "moe":
        raise NotApplicable("a sparse (MoE) layer: not wired in this adapter (keras-hub's qwen3_5_moe/)")
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("keras_hub") is None:
        raise GDNError(f"implementation 'keras' needs keras and keras-hub, not installed here: {INSTALL}")
    norm = weights.get("linear_attn.norm.weight")
    size = None if norm is None else int(np.size(norm))
    if size == cfg.value_dim and cfg.value_dim != cfg.head_v_dim:
        raise NotApplicable(f"per_head gated norm ({size} = Hv·dv weights): keras-hub's Qwen3_5RMSNormGated has "
                            f"one [dv = {cfg.head_v_dim}] weight shared by every head")
    if cfg.norm_mode is not None and ("shared" if size == cfg.head_v_dim else None) != cfg.norm_mode:
        raise NotApplicable(f"the config declares linear_norm_mode={cfg.norm_mode!r}, a setting keras-hub does not "
                            "have (it neither reads nor checks it)")
    return (impl_class or KerasLayer)(cfg, weights, profile)


keras.check_case = check_case


@dataclass
class KerasState:
    """keras-hub's cache of one layer (conv [B, conv_dim, K-1] in the compute dtype, recurrent [B, Hv, dk, dv]
    float32) and the K-th newest conv column it does not keep (FORMAT.md §5's conv_state has K), with the
    positions fed so far (keras-hub's cache keeps none)."""

    conv: Any
    recurrent: Any
    oldest: Any  # [B, conv_dim, 1]
    seq_len: np.ndarray


class KerasLayer:
    """An :class:`~gdncheck.harness.Implementation` driving keras-hub's ``Qwen3_5TransformerDecoder``."""

    def __init__(self, cfg: GDNConfig, weights, profile: str):
        os.environ.setdefault("KERAS_BACKEND", "torch")
        import keras as k3
        import torch

        if k3.backend.backend() != "torch":
            raise GDNError(f"implementation 'keras' runs keras-hub on Keras' torch backend; this process imported "
                           f"Keras with backend {k3.backend.backend()!r} (set KERAS_BACKEND=torch before)")
        import keras_hub
        from keras_hub.src.models.qwen3_5 import qwen3_5_gated_delta_net
        from keras_hub.src.models.qwen3_5.qwen3_5_decoder import Qwen3_5TransformerDecoder

        if torch.get_num_threads() != blas_threads():
            torch.set_num_threads(blas_threads())
        self.cfg, self.profile, self.torch, self.rules = cfg, profile, torch, qwen3_5_gated_delta_net
        self.dtype = getattr(torch, PROFILES[profile])
        self.layer = Qwen3_5TransformerDecoder(
            layer_type="linear_attention", intermediate_dim=cfg.intermediate_size, num_query_heads=1,
            num_key_value_heads=1, head_dim=cfg.head_k_dim, layer_norm_epsilon=cfg.rms_norm_eps,
            linear_num_key_heads=cfg.num_k_heads, linear_num_value_heads=cfg.num_v_heads,
            linear_key_head_dim=cfg.head_k_dim, linear_value_head_dim=cfg.head_v_dim,
            linear_conv_kernel_dim=cfg.conv_kernel, dtype=PROFILES[profile])
        self.layer.build((None, None, cfg.hidden_size))
        self.load(weights)
        self.name = (f"keras-hub {keras_hub.__version__} Qwen3_5TransformerDecoder ({profile}, keras "
                     f"{k3.__version__} torch backend, torch {torch.__version__})")

    # --- weights: what keras-hub's own converter (utils/transformers/convert_qwen3_5.py) does ---------------
    def variables(self) -> dict[str, tuple[Any, Any]]:
        """Each Hugging Face name -> (the keras variable, how the HF tensor becomes its value)."""
        d = self.layer
        g = d._linear_attn
        t = np.transpose
        return {
            "input_layernorm.weight": (d._input_layernorm.scale, None),
            "linear_attn.in_proj_qkv.weight": (g.in_proj_qkv.kernel, t),
            "linear_attn.in_proj_z.weight": (g.in_proj_z.kernel, t),
            "linear_attn.in_proj_a.weight": (g.in_proj_a.kernel, t),
            "linear_attn.in_proj_b.weight": (g.in_proj_b.kernel, t),
            "linear_attn.conv1d.weight": (g.conv1d_weight, lambda w: np.squeeze(w, axis=1)),
            "linear_attn.dt_bias": (g.dt_bias, None),
            "linear_attn.A_log": (g.A_log, None),
            "linear_attn.norm.weight": (g.norm.scale, None),
            "linear_attn.out_proj.weight": (g.out_proj.kernel, t),
            "post_attention_layernorm.weight": (d._post_attention_layernorm.scale, None),
            "mlp.gate_proj.weight": (d._feedforward_gate_dense.kernel, t),
            "mlp.up_proj.weight": (d._feedforward_intermediate_dense.kernel, t),
            "mlp.down_proj.weight": (d._feedforward_output_dense.kernel, t),
        }

    def load(self, weights) -> None:
        targets = self.variables()
        missing = sorted(set(targets) - set(weights))
        if missing:  # keras-hub's converter (loader.port_weight) fails on the first key the checkpoint lacks
            raise KerasRefused("missing_weight", f"keras-hub's converter finds no {', '.join(missing)}")
        for name, (var, convert) in targets.items():
            value = np.asarray(weights[name], dtype=np.float32)
            value = convert(value) if convert else value
            try:
                var.assign(value)
            except ValueError as exc:  # Keras refuses a value of another shape than the variable's
                raise KerasRefused(refusal_code(name, tuple(value.shape), tuple(var.shape)),
                                   f"Keras refused {name} for {var.path}: {exc}") from None

    # --- state -------------------------------------------------------------------------------------------
    def new_state(self, batch: int) -> KerasState:
        torch, cfg = self.torch, self.cfg
        return KerasState(torch.zeros(batch, cfg.conv_dim, cfg.conv_kernel - 1, dtype=self.dtype),
                          torch.zeros(batch, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim, dtype=torch.float32),
                          torch.zeros(batch, cfg.conv_dim, 1, dtype=self.dtype), np.zeros(batch, dtype=np.int64))

    def state_arrays(self, state: KerasState) -> dict[str, Any]:
        return {"conv_state": self.torch.cat([state.oldest, state.conv], dim=-1), "recurrent_state": state.recurrent}

    def snapshot(self, state: KerasState) -> KerasState:
        return copy.deepcopy(state)

    def restore(self, state: KerasState, snap: KerasState) -> None:
        fresh = copy.deepcopy(snap)
        state.conv, state.recurrent, state.oldest, state.seq_len = fresh.conv, fresh.recurrent, fresh.oldest, \
            fresh.seq_len

    def save_snapshot(self, snap: KerasState, path: str) -> None:
        raise NotApplicable("snapshot files: keras-hub has no file format for its generation cache")

    def load_snapshot(self, path: str) -> KerasState:
        raise NotApplicable("snapshot files: keras-hub has no file format for its generation cache")

    # --- forward -----------------------------------------------------------------------------------------
    def forward(self, x: np.ndarray, state: KerasState, seq_pos: np.ndarray):
        torch = self.torch
        seq_pos = np.asarray(seq_pos, dtype=np.int64)
        moved = np.flatnonzero(state.seq_len != seq_pos)
        if moved.size:
            b = int(moved[0])
            raise NotApplicable(
                f"the seq-len rule: row {b} is called at position {int(seq_pos[b])} but its state holds "
                f"{int(state.seq_len[b])} tokens; docs/spec.md §4 resets that row to zeros, keras-hub's cache keeps "
                "no position and resets no row")
        xt = torch.from_numpy(np.ascontiguousarray(x))
        if xt.is_floating_point():
            xt = xt.to(self.dtype)
        with torch.inference_mode(), self.recording() as trace:
            try:
                out, _, conv, rec = self.layer.call_and_update_cache(xt, None, state.conv, state.recurrent, 0)
            except (RuntimeError, ValueError, TypeError, IndexError) as exc:
                raise KerasRefused("input_error", f"keras-hub raised {type(exc).__name__} on the input of shape "
                                   f"{list(np.shape(x))} and dtype {np.asarray(x).dtype}: {exc}") from None
        window = torch.cat([state.oldest, state.conv, trace["qkv"].transpose(1, 2).to(self.dtype)], dim=-1)
        state.conv, state.recurrent, state.seq_len = conv, rec, seq_pos + x.shape[1]
        state.oldest = self.oldest_column(window)
        trace["out"] = out
        return out, self.stage_tensors(trace, int(x.shape[0]), int(x.shape[1]))

    def oldest_column(self, window):
        """The K-th newest column of the conv history (entering K columns, then the call's): the one keras-hub's
        K-1 columns do not keep."""
        return window[..., -self.cfg.conv_kernel:-self.cfg.conv_kernel + 1]

    @contextlib.contextmanager
    def recording(self):
        """Record the stage tensors keras-hub hands between its sub-layers and to its delta rule."""
        trace: dict[str, Any] = {}
        d, g = self.layer, self.layer._linear_attn
        layers = {n: getattr(d, n, None) or getattr(g, n) for n in _OUTPUTS}
        saved = {n: layer.__dict__.get("call") for n, layer in layers.items()}
        rules = {n: getattr(self.rules, n) for n in ("_chunk_gated_delta_rule", "_recurrent_gated_delta_rule")}

        def hook(name, layer):
            inner = type(layer).call.__get__(layer)

            def call(*args, **kwargs):
                if name in _INPUTS:
                    trace[_INPUTS[name]] = args[0]
                y = inner(*args, **kwargs)
                trace[_OUTPUTS[name]] = y
                return y
            return call

        def rule_hook(fn):
            def rule(query, key, value, g, beta, **kwargs):
                trace.update(q_in=query, k_in=key, v=value, g=g, beta=beta)
                core, final = fn(query, key, value, g, beta, **kwargs)
                trace["core"] = core
                return core, final
            return rule

        try:
            for n, layer in layers.items():
                layer.call = hook(n, layer)
            for n, fn in rules.items():
                setattr(self.rules, n, rule_hook(fn))
            yield trace
        finally:
            for n, layer in layers.items():
                if saved[n] is None:
                    layer.__dict__.pop("call", None)
                else:
                    layer.call = saved[n]
            for n, fn in rules.items():
                setattr(self.rules, n, fn)

    def stage_tensors(self, trace: dict[str, Any], B: int, T: int) -> dict[str, Any]:
        """The recorded tensors under gdncheck's names and shapes (FORMAT.md §5): reshapes and head selection
        only. The rule gets q and k repeated to Hv heads (value head j reads key head j // r) and before its
        L2 norm: one head of each group, with v, is the conv's output (qkv_conv)."""
        cfg = self.cfg
        r = cfg.num_v_heads // cfg.num_k_heads
        out = {name: trace[name] for name in ("x_norm", "qkv", "a", "b", "g", "beta", "h", "h_norm", "mlp_out", "out",
                                             "attn_out") if name in trace}
        if "z" in trace:
            out["z"] = trace["z"].reshape(B, T, cfg.num_v_heads, cfg.head_v_dim)
        if "core" in trace:
            out["core"] = trace["core"].reshape(B, T, cfg.num_v_heads, cfg.head_v_dim)
        if "core_gated" in trace:
            out["core_gated"] = trace["core_gated"].reshape(B, T, cfg.num_v_heads, cfg.head_v_dim)
        if "q_in" in trace:
            q, k = (trace[n][:, :, ::r].reshape(B, T, -1) for n in ("q_in", "k_in"))
            out["qkv_conv"] = self.torch.cat([q, k, trace["v"].reshape(B, T, -1)], dim=-1)
            out["v"] = trace["v"]
        return out
