"""The built-in ``triton`` implementation (conformance/ports/implementations.py) in stage-isolated mode
on a layer with the sparse block: its run_stage on golden (reference) inputs, stage by stage, against
the reference's stage functions. The Triton layer itself: tests/gpu_impl/test_layer_moe.py, whose
configuration and weights this uses, under the same fixture (outputs NaN-filled, the interpreter
emulating a GPU on the CPU: tests/gpu_impl/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest

import gdncheck.reference as R
from gdncheck.synthetic import make_inputs
from tests.gpu_impl.compare import check, to_np
from tests.gpu_impl.conftest import _nan_filled_outputs_on_an_emulated_gpu  # noqa: F401 (autouse, as there)
from tests.gpu_impl.helpers import DEVICE
from tests.gpu_impl.test_layer_moe import CFG, K, _weights
from tests.helpers import by_expert, routing_decided


@pytest.mark.parametrize("profile", ["f32", "bf16"])
def test_stage_isolated_block_stages(profile):
    """The built-in ``triton`` implementation's run_stage on golden (reference) inputs: each stage of
    the block, and ``mlp`` of a sparse layer (the sum), against the reference's stage functions."""
    from gdncheck.conformance.ports.implementations import triton

    w = _weights()
    impl = triton(CFG, w, profile=profile, device=str(DEVICE))
    ref = R.Layer(CFG, w)
    _, gold = ref.forward(make_inputs(CFG, 2, 9, seed=7), ref.new_state(2), 0)
    inputs = {name: gold[name] for name in ("h_norm", "router_logits", "routing_weights", "selected_experts",
                                            "experts_out", "shared_out")}
    got = {}
    for stage in ("router", "routing", "experts", "shared_expert", "mlp"):
        got.update(impl.run_stage(stage, inputs))
    decided = routing_decided(gold["router_logits"], K, profile)
    assert decided.mean() >= 0.8
    sel, weights = by_expert(got["selected_experts"].cpu().numpy(), to_np(got["routing_weights"]))
    gold_sel, gold_weights = by_expert(gold["selected_experts"], gold["routing_weights"])
    np.testing.assert_array_equal(sel[decided], gold_sel[decided])
    alike = (sel == gold_sel).all(-1)
    check(weights[alike], gold_weights[alike], "stage", profile, "routing_weights (stage-isolated)")
    for name in ("router_logits", "shared_out"):
        check(got[name], gold[name], "stage", profile, f"{name} (stage-isolated)")
    for name in ("experts_out", "mlp_out"):  # from the golden routing: every token
        check(got[name], gold[name], "stage", profile, f"{name} (stage-isolated)")
