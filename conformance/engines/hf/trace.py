"""The stage tensors of one transformers `Qwen3_5DecoderLayer` (or `Qwen3_5MoeDecoderLayer`) call, as
transformers computes them.

Two sources, nothing recomputed: forward hooks on the layer's submodules, and the module-level
functions of `modeling_qwen3_5` replaced by recording wrappers only while a call runs
(`Tracer.recording`). Only layouts change (to fixtures/FORMAT.md §5), and `shared_out` is formed
from its two hooked operands with the block's own two ops in its dtype.

Which hook gives which tensor, and each layout change: docs/ports.md §3.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from typing import Any

from gdncheck.config import GDNConfig

CONV_FUNCTIONS = ("causal_conv1d_fn", "causal_conv1d_update")
RULE_FUNCTIONS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")
FUNCTIONS = (*CONV_FUNCTIONS, *RULE_FUNCTIONS, "l2norm")

#: submodule (dotted path in the decoder layer) -> the stage tensor its output is
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
#: submodule -> the stage tensor its (first) input is
MODULE_INPUTS = {"post_attention_layernorm": "h"}
#: submodule of the sparse block -> what its output is (the router returns three tensors)
MOE_MODULE_OUTPUTS = {
    "mlp.gate": ("router_logits", "routing_weights", "selected_experts"),
    "mlp.experts": ("experts_out",),
    "mlp.shared_expert": ("shared_expert",),
    "mlp.shared_expert_gate": ("shared_gate_logit",),
}


class Recording:
    """What one call captured; :meth:`trace` puts it in the FORMAT.md §5 layouts."""

    def __init__(self, T: int, cfg: GDNConfig, B: int | None = None):
        self.T, self.B, self.cfg = T, B, cfg
        self.raw: dict[str, Any] = {}
        self.l2: list[Any] = []
        self.called: list[str] = []
        self.conv_columns: int | None = None  # columns the conv function ran over (T, or K + T with a cache)

    def put(self, name: str, tensor: Any) -> None:
        self.raw[name] = tensor.detach().clone()

    def trace(self) -> dict[str, Any]:
        cfg, raw = self.cfg, dict(self.raw)
        out = {k: raw[k] for k in ("x_norm", "qkv", "a", "b", "v", "g", "beta", "core", "attn_out", "h", "h_norm",
                                    "mlp_out") if k in raw}
        if "qkv" in raw:
            B, T = raw["qkv"].shape[:2]
            if "z" in raw:
                out["z"] = raw["z"].reshape(B, T, cfg.num_v_heads, cfg.head_v_dim)
            if "core_gated" in raw:  # transformers runs the gated norm on [B*T*Hv, dv] rows
                out["core_gated"] = raw["core_gated"].reshape(B, T, cfg.num_v_heads, cfg.head_v_dim)
            if "qkv_conv" in raw:  # [B, conv_dim, T'] (T' > T when the conv ran over the cached columns too)
                out["qkv_conv"] = raw["qkv_conv"][:, :, raw["qkv_conv"].shape[-1] - T:].transpose(1, 2)
        if len(self.l2) == 2:  # query, then key, each [B, Hv, T, dk] after repeat_interleave
            r = cfg.head_ratio
            out["q"], out["k"] = (t[:, ::r].transpose(1, 2) for t in self.l2)
        if "router_logits" in raw:
            out.update(self._block(raw))
        return out

    def _block(self, raw: dict[str, Any]) -> dict[str, Any]:
        """The sparse block's tensors, from [B·T, ...] rows to [B, T, ...]."""
        import torch

        B, T = self.B, self.T
        out = {name: raw[name].reshape(B, T, *raw[name].shape[1:])
               for name in ("router_logits", "routing_weights", "selected_experts", "experts_out") if name in raw}
        if "shared_expert" in raw and "shared_gate_logit" in raw:  # the block's F.sigmoid(gate) * shared
            shared = torch.sigmoid(raw["shared_gate_logit"]) * raw["shared_expert"]
            out["shared_out"] = shared.reshape(B, T, -1)
        return out


class Tracer:
    """Hooks on a decoder layer's submodules (always installed, active only while recording) and the
    recording wrappers of ``module``'s functions (installed for one call at a time)."""

    def __init__(self, layer, module, cfg: GDNConfig, sparse: bool = False):
        self.layer, self.module, self.cfg = layer, module, cfg
        self.calls: list[dict] = []
        self._rec: Recording | None = None
        for path, name in MODULE_OUTPUTS.items():
            layer.get_submodule(path).register_forward_hook(self._output_hook(name))
        for path, names in (MOE_MODULE_OUTPUTS.items() if sparse else ()):
            layer.get_submodule(path).register_forward_hook(self._outputs_hook(names))
        for path, name in MODULE_INPUTS.items():
            layer.get_submodule(path).register_forward_pre_hook(self._input_hook(name))

    def _output_hook(self, name: str):
        def hook(_module, _args, output):
            if self._rec is not None:
                self._rec.put(name, output)
        return hook

    def _outputs_hook(self, names: tuple[str, ...]):
        def hook(_module, _args, output):
            if self._rec is not None:
                for name, tensor in zip(names, output if isinstance(output, tuple) else (output,)):
                    self._rec.put(name, tensor)
        return hook

    def _input_hook(self, name: str):
        def hook(_module, args):
            if self._rec is not None:
                self._rec.put(name, args[0])
        return hook

    def _wrap(self, name: str, fn):
        rec = self._rec
        if name in CONV_FUNCTIONS:
            def conv(*args, **kwargs):
                out = fn(*args, **kwargs)
                rec.called.append(name)
                rec.conv_columns = int(out.shape[-1])
                rec.put("qkv_conv", out)
                return out
            return conv
        if name in RULE_FUNCTIONS:
            # transformers binds these to fla's Triton kernels when fla is installed (its
            # use_kernel_func_from_hub_with_fallback); those need a GPU driver, so on the CPU the port
            # runs transformers' own PyTorch function, which the decorator keeps as __wrapped__
            fn = getattr(fn, "__wrapped__", fn)
            signature = inspect.signature(fn)

            def rule(*args, **kwargs):
                bound = signature.bind_partial(*args, **kwargs).arguments
                result = fn(*args, **kwargs)
                rec.called.append(name)
                for ours, theirs in (("v", "value"), ("g", "g"), ("beta", "beta")):
                    rec.put(ours, bound[theirs])
                rec.put("core", result[0])
                return result
            return rule

        def l2norm(*args, **kwargs):
            out = fn(*args, **kwargs)
            rec.l2.append(out.detach().clone())
            return out
        return l2norm

    @contextmanager
    def recording(self, T: int, B: int | None = None):
        """Capture one call: yields its :class:`Recording`; the module's functions are restored after."""
        self._rec = Recording(T, self.cfg, B)
        saved = {name: getattr(self.module, name) for name in FUNCTIONS}
        try:
            for name, fn in saved.items():
                setattr(self.module, name, self._wrap(name, fn))
            yield self._rec
        finally:
            for name, fn in saved.items():
                setattr(self.module, name, fn)
            self.calls.append({"T": T, "functions": list(self._rec.called), "conv_columns": self._rec.conv_columns})
            self._rec = None
