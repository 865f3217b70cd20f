"""``run_stage(stage, inputs) -> outputs``: one stage alone from its golden inputs (fixtures/FORMAT.md §8).

Stage-isolated mode needs, per implementation, a way to call each stage by the vocabulary's names
(:data:`gdncheck.stages.STAGE_INPUTS` in, :data:`gdncheck.stages.STAGE_OUTPUTS` out). Two shapes
of implementation are common enough to be served here: a module whose stage functions mirror the
reference's (``gdncheck.reference`` itself, ``gdncheck.gpu_impl`` on torch tensors), and a layer
object with one method per stage (the emulated layer and its mutants). Neither is imported here:
the caller hands the module or the layer in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.stages import STAGE_INPUTS, STAGE_OUTPUTS

RunStage = Callable[[str, Mapping[str, np.ndarray]], dict[str, Any]]


def module_stage_runner(R, cfg: GDNConfig, w: Mapping, to_input, to_output) -> RunStage:
    """``run_stage`` over a module ``R`` whose stage functions mirror the reference's (name, argument
    order, return tuple). ``w`` holds the weights as the functions take them; ``to_input(name,
    array)`` converts a golden input, ``to_output(value)`` an output."""
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

    def run_stage(stage: str, inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        converted = {name: to_input(name, inputs[name]) for name in STAGE_INPUTS[stage]}
        return {name: to_output(v) for name, v in zip(STAGE_OUTPUTS[stage], calls[stage](converted))}

    return run_stage


def method_stage_runner(layer, store=None) -> RunStage:
    """``run_stage`` for a layer with one method per stage taking the STAGE_INPUTS in order (the
    emulated layer and its mutants). Golden inputs are first stored with ``store`` (the activation
    dtype), as a port reading them would; the recurrent state stays float32."""

    def run_stage(stage: str, inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        args = []
        for name in STAGE_INPUTS[stage]:
            arr = np.asarray(inputs[name], dtype=np.float32)
            args.append(arr if (store is None or name == "recurrent_state") else store(arr))
        result = getattr(layer, stage)(*args)
        result = result if isinstance(result, tuple) else (result,)
        return dict(zip(STAGE_OUTPUTS[stage], result))

    return run_stage
