"""Errors (docs/spec.md §5, fixtures/FORMAT.md §6) for generated shapes: every norm-mode, configuration,
weight and input error is refused with its code (or a more general code of its family), through
the same route as a fixture case: gdncheck's config parser, then the implementation's factory,
then ``forward``."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from gdncheck.config import GDNConfig
from gdncheck.fixtures.build import accepted_codes as accepted
from gdncheck.harness import error_code
from gdncheck.weights import LayerWeights

from .registry import Subject, prop
from .strategies import InputDraw, build_inputs, build_weights, configs, weight_draws

ERRORS = ("missing_head_setting", "head_ratio", "invalid_eps", "unknown_norm_mode", "norm_mode_conflict",
          "norm_weight_size", "projection_size", "missing_weight", "conv_kernel_mismatch", "input_shape",
          "input_dtype")


def broken(code: str, cfg: GDNConfig, weights: dict, data) -> tuple[dict, dict]:
    """A config dict and weights that break exactly one rule, the one of ``code``."""
    conf = cfg.to_hf()
    w = dict(weights)
    mode = "per_head" if w["linear_attn.norm.weight"].size == cfg.value_dim and cfg.num_v_heads > 1 else "shared"
    if code == "missing_head_setting":
        del conf[data.draw(st.sampled_from(("linear_num_key_heads", "linear_num_value_heads",
                                            "linear_key_head_dim", "linear_value_head_dim")), label="removed key")]
    elif code == "head_ratio":
        conf["linear_num_key_heads"] = cfg.num_v_heads + 1
    elif code == "invalid_eps":
        conf["rms_norm_eps"] = data.draw(st.sampled_from((0.0, -1e-6)), label="eps")
    elif code == "unknown_norm_mode":
        conf["linear_norm_mode"] = data.draw(st.sampled_from(("grouped", "head", "")), label="norm mode")
    elif code == "norm_mode_conflict":
        conf["linear_norm_mode"] = "shared" if mode == "per_head" else "per_head"
    elif code == "norm_weight_size":
        w["linear_attn.norm.weight"] = np.ones(cfg.head_v_dim + 1, dtype=np.float32)
    elif code == "projection_size":
        w["linear_attn.in_proj_qkv.weight"] = w["linear_attn.in_proj_qkv.weight"][:-1]
    elif code == "missing_weight":
        del w[data.draw(st.sampled_from(sorted(w)), label="removed weight")]
    elif code == "conv_kernel_mismatch":
        conf["linear_conv_kernel_dim"] = cfg.conv_kernel % 4 + 1
    return conf, w


@prop("errors", once=True)
def configuration_errors(subject: Subject, data) -> None:
    """Each error of docs/spec.md §5 is refused with its code (or its family's), at construction or at the call."""
    cfg = data.draw(configs(), label="config")
    assume_multi = cfg.num_v_heads > 1
    code = data.draw(st.sampled_from([c for c in ERRORS if assume_multi or c != "norm_mode_conflict"]),
                     label="error")
    weights = build_weights(cfg, data.draw(weight_draws(regimes=("checkpoint",)), label="weights"))
    conf, w = broken(code, cfg, weights, data)
    where = f"{code}: {cfg.summary()}"
    got, step = None, None
    try:
        parsed = GDNConfig.from_hf(dict(conf))
        impl = subject.make(parsed, LayerWeights(w, config=parsed))
        step = "forward"
        state = impl.new_state(1)
        x = build_inputs(cfg, 1, 3, _inputs())
        if code == "input_shape":
            x = data.draw(st.sampled_from(("wrong D", "no tokens", "no batch")), label="bad shape")
            x = {"wrong D": np.zeros((1, 3, cfg.hidden_size + 1), np.float32),
                 "no tokens": np.zeros((1, 0, cfg.hidden_size), np.float32),
                 "no batch": np.zeros((3, cfg.hidden_size), np.float32)}[x]
        elif code == "input_dtype":
            x = np.ones((1, 3, cfg.hidden_size), dtype=np.int32)
        impl.forward(x, state, np.zeros(1, dtype=np.int64))
    except Exception as exc:  # noqa: BLE001 - the code decides
        got = (error_code(exc), str(exc))
    want = accepted(code)
    if got is None:
        raise AssertionError(f"no error was raised, but should raise {code} (or {', '.join(want[1:])}) [{where}]")
    if got[0] not in want:
        raise AssertionError(f"raised {got[0]}: {got[1]}, but should raise {code} (accepted: {', '.join(want)}) "
                             f"[{where}, at {step or 'construction'}]")


def _inputs():
    return InputDraw(0, "normal")
