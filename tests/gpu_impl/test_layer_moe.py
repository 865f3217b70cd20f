"""The Triton layer with the sparse mixture-of-experts block against the float64 reference layer, per
profile: prefill, decode and a short prefill after them, capture mode, slices of tokens; and what a
GPU run needs (no host read, grids, the memory model; the compile check at real sizes is in
tests/gpu_tools/test_compile_check.py).
The built-in ``triton`` port's isolated block stages: tests/ports/test_triton_moe_stages.py.

Routing is discontinuous, so the block is judged where its inputs are the same: the reference block
run on the Triton layer's *own* h_norm. There a correct port can only flip a token's routing where
the k-th and (k+1)-th router logits are closer than the rounding of a logit (``routing_decided``):
those tokens must route exactly as the reference does, and the block's tensors are compared on the
tokens routed alike. The token mixer (x .. h_norm) and the states are compared with the reference
layer as for a dense layer.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gdncheck.reference as R
from gdncheck.config import REAL_MOE, GDNConfig
from gdncheck.experts import (
    EXPERTS_DOWN,
    EXPERTS_GATE_UP,
    ROUTER,
    SHARED_DOWN,
    SHARED_EXPERT_GATE,
    SHARED_GATE,
    SHARED_UP,
)
from gdncheck.gpu_impl import Layer
from gdncheck.gpu_impl import memory as M
from gdncheck.gpu_impl import moe as G
from gdncheck.gpu_impl.target import GRID_LIMITS, record_launches
from gdncheck.stages import layer_tensors, moe_layer_tensor_names
from gdncheck.synthetic import make_inputs, make_weights
from tests.gpu_impl.compare import check, to_np
from tests.gpu_impl.helpers import DEVICE, PROFILE_NAMES
from tests.gpu_impl.test_gpu_ready import HostTraffic, peak_allocated
from tests.helpers import by_expert, routing_decided

CFG = GDNConfig(hidden_size=32, intermediate_size=None, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8,
                num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24)
K = CFG.num_experts_per_tok
#: a chunked prefill (18 > 16 tokens), a decode step, a short prefill (the fused recurrent kernel)
SEGMENTS = [(0, 18), (18, 19), (19, 24)]


def _weights(seed: int = 3):
    return make_weights(CFG, seed=seed, router_std=0.3)


def _reference_block(h_norm: np.ndarray, w) -> dict[str, np.ndarray]:
    Im = CFG.moe_intermediate_size
    out = R.mlp_moe(h_norm, w[ROUTER], w[EXPERTS_GATE_UP][:, :Im], w[EXPERTS_GATE_UP][:, Im:], w[EXPERTS_DOWN],
                    w[SHARED_GATE], w[SHARED_UP], w[SHARED_DOWN], w[SHARED_EXPERT_GATE], K, CFG.norm_topk_prob)
    return dict(zip(("router_logits", "routing_weights", "selected_experts", "experts_out", "shared_out", "mlp_out"),
                    out))


def _check_block(trace: dict, w, profile: str, where: str) -> np.ndarray:
    """The block's tensors against the reference block on the layer's own h_norm; returns the tokens
    [B, T] routed alike."""
    blk = _reference_block(to_np(trace["h_norm"]), w)
    decided = routing_decided(blk["router_logits"], K, profile)
    assert decided.mean() >= 0.9, f"{where}: only {decided.mean():.0%} of the tokens are off a tie: the case is weak"
    assert trace["selected_experts"].dtype == torch.int64
    sel, weights = by_expert(trace["selected_experts"].cpu().numpy(), to_np(trace["routing_weights"]))
    blk["selected_experts"], blk["routing_weights"] = by_expert(blk["selected_experts"], blk["routing_weights"])
    np.testing.assert_array_equal(sel[decided], blk["selected_experts"][decided], err_msg=f"{where}: routing")
    alike = (sel == blk["selected_experts"]).all(-1)
    check(trace["router_logits"], blk["router_logits"], "stage", profile, f"router_logits {where}")
    check(trace["shared_out"], blk["shared_out"], "stage", profile, f"shared_out {where}")
    check(weights[alike], blk["routing_weights"][alike], "stage", profile, f"routing_weights {where}")
    for name in ("experts_out", "mlp_out"):
        check(to_np(trace[name])[alike], blk[name][alike], "stage", profile, f"{name} {where}")
    return alike


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_sparse_layer_against_reference(profile):
    w = _weights()
    ref, layer = R.Layer(CFG, w), Layer(CFG, w, profile=profile, device=DEVICE, chunk_size=16)
    assert layer.mlp_kind == "moe"
    x = make_inputs(CFG, 2, SEGMENTS[-1][1], seed=4)
    ref_state, state = ref.new_state(2), layer.new_state(2)
    for a, b in SEGMENTS:
        where = f"of tokens {a}:{b}"
        want, ref_trace = ref.forward(x[:, a:b], ref_state, a)
        got, trace = layer.forward(x[:, a:b], state, a, capture=True)
        for name in ("core", "attn_out", "h", "h_norm"):
            check(trace[name], ref_trace[name], "layer", profile, f"{name} {where}")
        _check_block(trace, w, profile, where)
        same = (by_expert(trace["selected_experts"].cpu().numpy(), ref_trace["routing_weights"])[0] ==
                by_expert(ref_trace["selected_experts"], ref_trace["routing_weights"])[0]).all(-1)
        check(to_np(got)[same], want[same], "layer", profile, f"out {where}, tokens routed as the reference layer")
    check(state.recurrent_state, ref_state.recurrent_state, "layer", profile, "final recurrent_state")
    check(state.conv_state, ref_state.conv_state, "layer", profile, "final conv_state")
    assert state.seq_len.tolist() == [24, 24]


@pytest.mark.parametrize("T", [1, 20])
def test_capture_returns_the_sparse_trace_and_changes_nothing(T):
    w = _weights()
    layer = Layer(CFG, w, profile="bf16", device=DEVICE, chunk_size=16)
    x = make_inputs(CFG, 2, T, seed=5)
    s1, s2 = layer.new_state(2), layer.new_state(2)
    out1, trace1 = layer.forward(x, s1, 0)
    out2, trace = layer.forward(x, s2, 0, capture=True)
    assert trace1 == {} and torch.equal(out1, out2), "capture changed the output"
    assert torch.equal(s1.recurrent_state, s2.recurrent_state) and torch.equal(s1.conv_state, s2.conv_state)
    assert tuple(trace) == moe_layer_tensor_names()
    dims = {**CFG.dims(), "T": T}
    for spec in layer_tensors("moe"):
        assert tuple(trace[spec.name].shape) == (2, *(dims[s] for s in spec.shape)), spec.name
    assert trace["routing_weights"].dtype == torch.float32 and trace["mlp_out"].dtype == torch.bfloat16
    # the combine stored the sum once from fp32: within one bf16 rounding of the sum of the stored parts
    check(trace["mlp_out"], to_np(trace["experts_out"]) + to_np(trace["shared_out"]), "stage", "bf16",
          "mlp_out against experts_out + shared_out")


def test_token_slices_give_the_same_block(monkeypatch):
    """A budget of 5 tokens' slot buffers: 40 tokens run the experts in 8 passes, with the same result."""
    w = _weights()
    layer = Layer(CFG, w, profile="f32", device=DEVICE, chunk_size=16)
    x = make_inputs(CFG, 2, 20, seed=6)
    whole, trace = layer.forward(x, layer.new_state(2), 0, capture=True)
    per_token = G.slot_bytes_per_token(K, CFG.hidden_size, CFG.moe_intermediate_size, 4)
    monkeypatch.setattr(G, "MOE_BUDGET", 5 * per_token)
    with record_launches() as launches:
        layer.forward(x, layer.new_state(2), 0)
    assert sum(1 for launch in launches if launch.kernel == "expert_gate_up_kernel") == 8
    sliced, sliced_trace = layer.forward(x, layer.new_state(2), 0, capture=True)
    for name in ("experts_out", "mlp_out"):
        check(sliced_trace[name], trace[name], "forms", "f32", f"{name}, sliced against whole")
    check(sliced, whole, "forms", "f32", "out, sliced against whole")


# --- what a GPU run needs ----------------------------------------------------------------------------


@pytest.mark.parametrize("T", [1, 40])
def test_sparse_forward_reads_nothing_on_the_host_and_stays_inside_the_grid_limits(T):
    """At real sizes (E = 512, top 10) on meta tensors: the routing stays on the device (no value
    read, no copy), and at B = 4096 every grid fits CUDA's limits."""
    for B in (4, 4096):
        layer = Layer.shaped(REAL_MOE, profile="bf16")
        x = torch.empty((B, T, REAL_MOE.hidden_size), dtype=torch.bfloat16, device="meta")
        with record_launches() as launches, HostTraffic() as traffic:
            layer.forward(x, layer.new_state(B), 7)
        assert traffic.reads == [] and traffic.copies == []
        assert {"routing_kernel", "expert_gate_up_kernel", "expert_down_kernel", "combine_kernel"} <= \
            {launch.kernel for launch in launches}
        for launch in launches:
            assert len(launch.grid) <= 3 and all(1 <= g <= lim for g, lim in zip(launch.grid, GRID_LIMITS)), launch


@pytest.mark.parametrize("profile", ["bf16", "f32"])
def test_memory_model_matches_the_allocations_of_a_sparse_call(profile, monkeypatch):
    """The peak of one sparse prefill (kernels recorded, not run) against memory.py's phase model,
    with a budget that slices the tokens for the experts in three. 16 tokens (the recurrent rule, no
    chunked temporaries) of 40 sequences, top 4 of 16 experts: the block's phase is the peak."""
    cfg = CFG.replace(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48)
    B, T = 40, 16
    e = 4 if profile == "f32" else 2
    budget = B * T // 3 * G.slot_bytes_per_token(4, cfg.hidden_size, cfg.moe_intermediate_size, e)
    monkeypatch.setattr(G, "MOE_BUDGET", budget)
    layer = Layer(cfg, make_weights(cfg, seed=1), profile=profile, device="cpu", chunk_size=64)
    x, state = torch.zeros(B, T, cfg.hidden_size, dtype=layer.dtype), layer.new_state(B)
    with record_launches():
        measured = peak_allocated(lambda: layer.forward(x, state, 0))
    model = M.call_peak(cfg, B, T, profile, chunk=64, moe_budget=budget)
    assert model.phase == "moe_experts", model
    assert abs(measured - model.bytes) <= 0.03 * model.bytes + 16384, (measured, model)


def test_sparse_call_at_real_sizes_fits_an_h200():
    """Qwen3-Next-80B-A3B sizes: the slot buffers of a long prefill are sliced to the budget."""
    peak = M.call_peak(REAL_MOE, 1, 32768, "bf16")
    slots = M.per_token(REAL_MOE, "bf16")["slots"]
    assert slots >= 10 * 4 * 2048  # 80 KB a token: 2.7 GB at T = 32768 unsliced
    assert peak.phases["moe_experts"] < 32768 * slots and M.total_bytes(REAL_MOE, 64, 8192, "bf16") <= M.H200_BYTES
    assert M.resident_bytes(REAL_MOE, 1, "bf16") > 512 * 3 * 512 * 2048 * 2  # the experts dominate the weights


def test_kernel_names_are_unique():
    """The compile table and the launch records name a kernel by its function's name: two kernels of
    one name would share a row (the sparse block's SwiGLU over strided columns once shared the dense
    MLP's name, and the compile check bound one's arguments to the other's signature)."""
    import importlib
    import pkgutil

    import gdncheck.gpu_impl as package
    from gdncheck.gpu_impl.target import Kernel

    seen: dict[str, str] = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, Kernel) and value.fn.__module__ == module.__name__:
                assert seen.setdefault(value.__name__, module.__name__) == module.__name__, value.__name__
    assert {"swiglu_kernel", "shared_swiglu_kernel", "routing_kernel"} <= set(seen)
