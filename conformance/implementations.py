"""The built-in implementations, each a factory of the plug-in contract (:mod:`.plugin`).

``reference``
    profile ``f64``: the float64 reference itself (``gdncheck.reference.Layer``). Profiles ``f32``,
    ``bf16``, ``f16``: the reference's math with that profile's roundings emulated
    (:class:`.emulate.EmulatedLayer`, placement ``hf`` unless ``--option placement=fla|fp32_once|metrale``).
    This is what a correct port of the profile computes, so ``run reference --profile bf16`` followed
    by ``verify --profile bf16`` passes; ``--profile f64`` passes in every profile.
``triton``
    ``gdncheck.gpu_impl.Layer`` (imported on first use), driven exactly like an outside port.
``hf``
    Hugging Face transformers' own ``Qwen3_5DecoderLayer`` and cache (:mod:`.hf`; the ``hf`` extra),
    profiles ``f32``, ``bf16`` (and ``f16``) on the CPU; what it cannot express is reported not applicable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.errors import GDNError
from gdncheck.snapshot import Snapshot
from gdncheck.stages import STAGE_INPUTS

from .hf import hf
from .plugin import LayerAdapter
from .vocab import STAGE_OUTPUTS

STATE_INPUTS = ("conv_state", "recurrent_state")


def reference_stage_runner(cfg: GDNConfig, weights: Mapping[str, np.ndarray]):
    """``run_stage(stage, inputs) -> outputs`` with the float64 reference's stage functions."""
    from gdncheck import reference as R

    w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    return module_stage_runner(R, cfg, w, lambda name, a: np.asarray(a, dtype=np.float64), lambda a: a)


def module_stage_runner(R, cfg: GDNConfig, w: Mapping, to_input, to_output):
    """``run_stage`` over a module whose stage functions mirror the reference's (name, argument order,
    return tuple): ``gdncheck.reference``, or ``gdncheck.gpu_impl`` on torch tensors. ``w`` holds the
    weights as the functions take them; ``to_input(name, array)`` converts a golden input,
    ``to_output(value)`` an output."""
    eps = cfg.rms_norm_eps
    calls = {
        "input_norm": lambda i: (R.input_norm(i["x"], w["input_layernorm.weight"], eps),),
        "in_proj": lambda i: R.in_proj(i["x_norm"], w["linear_attn.in_proj_qkv.weight"],
                                       w["linear_attn.in_proj_z.weight"], w["linear_attn.in_proj_a.weight"],
                                       w["linear_attn.in_proj_b.weight"]),
        "conv1d": lambda i: R.conv1d(i["qkv"], i["conv_state"], w["linear_attn.conv1d.weight"]),
        "qk_norm": lambda i: R.qk_norm(i["qkv_conv"], cfg.num_k_heads, cfg.head_k_dim, cfg.num_v_heads,
                                       cfg.head_v_dim),
        "gates": lambda i: R.gates(i["a"], i["b"], w["linear_attn.A_log"], w["linear_attn.dt_bias"]),
        "delta_rule": lambda i: R.delta_rule_recurrent(i["q"], i["k"], i["v"], i["g"], i["beta"],
                                                       i["recurrent_state"], cfg.scale),
        "gated_norm": lambda i: (R.gated_norm(i["core"], i["z"], w["linear_attn.norm.weight"], eps),),
        "out_proj": lambda i: (R.out_proj(i["core_gated"], w["linear_attn.out_proj.weight"]),),
        "residual": lambda i: (R.residual(i["x"], i["attn_out"]),),
        "post_norm": lambda i: (R.post_norm(i["h"], w["post_attention_layernorm.weight"], eps),),
        "mlp": lambda i: (R.mlp(i["h_norm"], w["mlp.gate_proj.weight"], w["mlp.up_proj.weight"],
                                w["mlp.down_proj.weight"]),),
        "output": lambda i: (R.output(i["h"], i["mlp_out"]),),
    }

    def run_stage(stage: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        converted = {name: to_input(name, inputs[name]) for name in STAGE_INPUTS[stage]}
        return {name: to_output(v) for name, v in zip(STAGE_OUTPUTS[stage], calls[stage](converted))}

    return run_stage


def triton_stage_runner(layer, cfg: GDNConfig, weights: Mapping[str, np.ndarray]):
    """``run_stage`` with ``gdncheck.gpu_impl``'s stage functions on the layer's device: golden inputs
    stored in the profile dtype as a port reading them would (g, beta and the recurrent state fp32),
    weights as the layer holds them (1-D parameters fp32, matrices in the profile dtype)."""
    import torch
    from gdncheck.gpu_impl.layer import FP32_PARAMS

    from gdncheck import gpu_impl

    def tensor(a, dtype):  # fresh row-major strides (numpy's may differ on size-1 axes)
        a = np.asarray(a, dtype=np.float64)
        return torch.empty(a.shape, dtype=dtype, device=layer.device).copy_(torch.from_numpy(a.copy()))

    w = {k: tensor(v, torch.float32 if k in FP32_PARAMS else layer.dtype) for k, v in weights.items()}
    fp32 = ("g", "beta", "recurrent_state")
    return module_stage_runner(gpu_impl, cfg, w,
                               lambda name, a: tensor(a, torch.float32 if name in fp32 else layer.dtype),
                               lambda v: v)


def method_stage_runner(layer, store=None):
    """``run_stage`` for a layer with one method per stage taking the STAGE_INPUTS in order (the
    emulated layer and its mutants). Golden inputs are first stored in the activation dtype, as a
    port reading them would; the recurrent state stays float32."""

    def run_stage(stage: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        args = []
        for name in STAGE_INPUTS[stage]:
            arr = np.asarray(inputs[name], dtype=np.float32)
            args.append(arr if (store is None or name == "recurrent_state") else store(arr))
        result = getattr(layer, stage)(*args)
        result = result if isinstance(result, tuple) else (result,)
        return dict(zip(STAGE_OUTPUTS[stage], result))

    return run_stage


def reference(cfg: GDNConfig, weights, *, profile: str = "f64", strict: bool = False, placement: str = "hf",
              chunk_size: int = 64, **options) -> LayerAdapter:
    """The float64 reference (profile f64) or its precision emulation (f32, bf16, f16)."""
    if options:
        raise GDNError(f"reference: unknown option(s) {', '.join(sorted(options))}; known: placement, chunk_size")
    if profile == "f64":
        from gdncheck.reference import Layer

        layer = Layer(cfg, weights, strict=strict, chunk_size=chunk_size)
        return LayerAdapter(layer, "reference (float64)", load_snapshot=Snapshot.load,
                            stage_runner=reference_stage_runner(cfg, weights))
    from .emulate import EmulatedLayer

    layer = EmulatedLayer(cfg, weights, profile=profile, placement=placement, strict=strict, chunk_size=chunk_size)
    return emulated_adapter(layer, f"reference ({profile} emulated, placement {placement})")


def emulated_adapter(layer, name: str) -> LayerAdapter:
    return LayerAdapter(layer, name, load_snapshot=Snapshot.load,
                        stage_runner=method_stage_runner(layer, layer.store))


class CapturingAdapter(LayerAdapter):
    """A :class:`LayerAdapter` whose layer returns every stage tensor when asked with ``capture=True``
    (``gdncheck.gpu_impl.Layer``): verify then judges, and localises, every stage, not only ``out``."""

    def forward(self, x: np.ndarray, state, seq_pos: np.ndarray):
        return self.layer.forward(self._prepare(x), state, seq_pos, capture=True)


def triton(cfg: GDNConfig, weights, *, profile: str = "f32", strict: bool = False, capture: bool = True,
           **options) -> LayerAdapter:
    """``gdncheck.gpu_impl.Layer`` on ``GDN_DEVICE`` (default ``auto``); every stage tensor is returned
    (``capture``; ``--option capture=false`` hands out ``out`` and the states only, as a fast path would)."""
    try:
        from gdncheck.gpu_impl import Layer

        from gdncheck import gpu_impl
    except ImportError as exc:
        raise GDNError(
            f"implementation 'triton' needs gdncheck.gpu_impl.Layer, which cannot be imported here ({exc}); "
            "install the triton extra (pip install -e '.[triton]')"
        ) from None
    if profile == "f64":
        raise GDNError("implementation 'triton' runs in profile f32, bf16 or f16, found f64")
    device = options.pop("device", os.environ.get("GDN_DEVICE", "auto"))
    layer = Layer(cfg, weights, profile=profile, device=device, strict=strict, **options)
    loader = gpu_impl.DeviceSnapshot.load if hasattr(gpu_impl, "DeviceSnapshot") else Snapshot.load
    runner = getattr(layer, "run_stage", None) or triton_stage_runner(layer, cfg, weights)
    adapter = CapturingAdapter if capture else LayerAdapter
    return adapter(layer, f"triton ({profile}, device {device})", load_snapshot=loader, stage_runner=runner)


BUILTIN = {"reference": reference, "triton": triton, "hf": hf}
