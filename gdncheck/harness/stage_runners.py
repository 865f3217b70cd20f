"""``run_stage(stage, inputs) -> outputs``: one stage alone from its golden inputs (fixtures/FORMAT.md §8).

Stage-isolated mode needs, per implementation, a way to call each stage by the vocabulary's names
(:data:`gdncheck.stages.STAGE_INPUTS` in, :data:`gdncheck.stages.STAGE_OUTPUTS` out). Two shapes
of implementation are common enough to be served here: a module whose stage functions mirror the
reference's (``gdncheck.reference`` itself, ``gdncheck.gpu_impl`` on torch tensors), and a layer
object with one method per stage (the emulated layer and its mutants). Neither is imported here:
the caller hands the module or the layer in.

A layer with the sparse mixture-of-experts block (its weights hold the router,
:func:`gdncheck.experts.mlp_kind_of`) runs the block's stages too (``router``, ``routing``,
``experts``, ``shared_expert``) and its ``mlp`` stage is the sum ``moe_sum(experts_out,
shared_out)`` (:data:`gdncheck.stages.MOE_MLP_STAGE`). ``selected_experts`` is handed in as
integers, never through a float conversion.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.experts import (
    EXPERTS_DOWN,
    EXPERTS_GATE_UP,
    ROUTER,
    SHARED_DOWN,
    SHARED_EXPERT_GATE,
    SHARED_GATE,
    SHARED_UP,
    mlp_kind_of,
)
from gdncheck.stages import is_index_tensor, layer_stage

RunStage = Callable[[str, Mapping[str, np.ndarray]], dict[str, Any]]


def _index_array(a) -> np.ndarray:
    return np.asarray(a, dtype=np.int64)


def module_stage_runner(R, cfg: GDNConfig, w: Mapping, to_input, to_output, to_index=_index_array) -> RunStage:
    """``run_stage`` over a module ``R`` whose stage functions mirror the reference's (name, argument
    order, return tuple). ``w`` holds the weights as the functions take them; ``to_input(name,
    array)`` converts a golden input, ``to_index(array)`` an integer one (``selected_experts``; default:
    an int64 NumPy array), ``to_output(value)`` an output."""
    eps = cfg.rms_norm_eps
    kind = mlp_kind_of(w)
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
    if kind == "moe":
        Im = cfg.moe_intermediate_size
        calls.update({
            "router": lambda i: (R.router(i["h_norm"], w[ROUTER]),),
            "routing": lambda i: R.routing(i["router_logits"], cfg.num_experts_per_tok, cfg.norm_topk_prob),
            "experts": lambda i: (R.experts(i["h_norm"], i["routing_weights"], i["selected_experts"],
                                            w[EXPERTS_GATE_UP][:, :Im], w[EXPERTS_GATE_UP][:, Im:],
                                            w[EXPERTS_DOWN]),),
            "shared_expert": lambda i: (R.shared_expert(i["h_norm"], w[SHARED_GATE], w[SHARED_UP], w[SHARED_DOWN],
                                                        w[SHARED_EXPERT_GATE]),),
            "mlp": lambda i: (R.moe_sum(i["experts_out"], i["shared_out"]),),
        })

    def run_stage(stage: str, inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        spec = layer_stage(stage, kind)
        converted = {name: to_index(inputs[name]) if is_index_tensor(name) else to_input(name, inputs[name])
                     for name in spec.inputs}
        return {name: to_output(v) for name, v in zip(spec.outputs, calls[stage](converted))}

    return run_stage


def method_stage_runner(layer, store=None, keep_f32: tuple[str, ...] = ()) -> RunStage:
    """``run_stage`` for a layer with one method per stage (named by the stage's
    ``function_name``) taking the stage's inputs in order (the emulated layer and its mutants).
    Golden inputs are first stored with ``store`` (the activation dtype), as a port reading them
    would; the recurrent state and the names in ``keep_f32`` stay float32, integers stay int64. The
    layer's ``mlp_kind`` attribute (default ``dense``) picks the pipeline. A method returning None
    for an output leaves it out (a port that does not compute it)."""
    kind = getattr(layer, "mlp_kind", "dense")

    def run_stage(stage: str, inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        spec = layer_stage(stage, kind)
        args = []
        for name in spec.inputs:
            if is_index_tensor(name):
                args.append(_index_array(inputs[name]))
                continue
            arr = np.asarray(inputs[name], dtype=np.float32)
            args.append(arr if (store is None or name == "recurrent_state" or name in keep_f32) else store(arr))
        result = getattr(layer, spec.function_name)(*args)
        result = result if isinstance(result, tuple) else (result,)
        return {name: v for name, v in zip(spec.outputs, result) if v is not None}

    return run_stage
