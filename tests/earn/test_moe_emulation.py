"""The precision-emulating layer on a layer with the sparse block (conformance/earn/emulate_moe.py):
the ``hf`` placement rounds as transformers' own block does, each placement rounds where
docs/tolerances.md says, exact ties go to the lower index in every profile, and the block runs
through the port contract end to end, stage by stage, and in the tolerance derivation's isolated
observation."""

from __future__ import annotations

import numpy as np
import pytest

import gdncheck.reference as R
from gdncheck.config import GDNConfig
from gdncheck.conformance.earn import derive
from gdncheck.conformance.earn.emulate import PLACEMENTS, EmulatedLayer, emulated
from gdncheck.conformance.earn.lowp import store
from gdncheck.conformance.judge.metrics import CaseStats
from gdncheck.experts import ROUTER
from gdncheck.fixtures.reference_impl import reference_f64
from gdncheck.harness import call_key, call_steps, execute
from gdncheck.stages import layer_stage_names, moe_layer_tensor_names, stage_inputs, stage_outputs
from gdncheck.synthetic import make_inputs, make_weights
from tests.helpers import by_expert, moe_case, rel_err, routing_decided

CFG = GDNConfig(hidden_size=64, intermediate_size=None, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8,
                num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32, shared_expert_intermediate_size=48)
K = CFG.num_experts_per_tok
BLOCK = ("router_logits", "routing_weights", "experts_out", "shared_out", "mlp_out")


def _weights(**kw):
    return make_weights(CFG, seed=1, std=0.1, router_std=0.1, **kw)


def _tokens(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(1, n, CFG.hidden_size)).astype(np.float32)


def _exact_in(x, profile: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return store(x, profile) == x


@pytest.mark.parametrize("profile", ["bf16", "f16"])
def test_hf_placement_rounds_as_transformers_block(profile):
    """transformers' ``Qwen3_5MoeSparseMoeBlock`` in the profile's dtype on the same h_norm: the
    ``hf`` placement gives the same numbers (CPU GEMMs of another summation order may flip a rounding
    here and there), the ``fla`` placement, which rounds elsewhere, mostly other ones."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import Qwen3_5MoeTextConfig, logging
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeSparseMoeBlock

    logging.set_verbosity_error()
    w = _weights()
    hc = Qwen3_5MoeTextConfig(hidden_size=CFG.hidden_size, num_experts=CFG.num_experts, num_experts_per_tok=K,
                              moe_intermediate_size=CFG.moe_intermediate_size, hidden_act="silu",
                              shared_expert_intermediate_size=CFG.shared_expert_intermediate_size, vocab_size=16,
                              num_hidden_layers=1)
    block = Qwen3_5MoeSparseMoeBlock(hc)
    block.load_state_dict({k[len("mlp."):]: torch.from_numpy(np.asarray(v, dtype=np.float32))
                           for k, v in w.items() if k.startswith("mlp.")}, strict=True)
    dtype = getattr(torch, {"bf16": "bfloat16", "f16": "float16"}[profile])
    block = block.to(dtype)
    seen = {}
    block.gate.register_forward_hook(lambda m, i, o: seen.__setitem__("gate", o))
    block.experts.register_forward_hook(lambda m, i, o: seen.__setitem__("experts_out", o))
    h = torch.from_numpy(_tokens(200)).to(dtype)
    with torch.no_grad():
        theirs = {"mlp_out": block(h).float().numpy()[0]}
    theirs["router_logits"] = seen["gate"][0].float().numpy()
    theirs["experts_out"] = seen["experts_out"].float().numpy()
    h = h.float().numpy()
    equal = {}
    for placement in ("hf", "fla"):
        ours = EmulatedLayer(CFG, w, profile=profile, placement=placement).moe_block(h)
        np.testing.assert_array_equal(np.sort(ours["selected_experts"][0], -1), np.sort(seen["gate"][2].numpy(), -1))
        equal[placement] = {n: float(np.mean(ours[n].reshape(theirs[n].shape) == theirs[n])) for n in theirs}
    assert min(equal["hf"].values()) >= 0.95, equal
    assert equal["fla"]["experts_out"] < 0.8 and equal["fla"]["mlp_out"] < 0.8, equal


def test_each_placement_rounds_where_it_says():
    """bf16: which of the block's tensors hold bf16 numbers (docs/tolerances.md's placements table)."""
    w, h = _weights(), store(_tokens(64), "bf16")
    exact = {}
    for placement in PLACEMENTS:
        t = EmulatedLayer(CFG, w, profile="bf16", placement=placement).moe_block(h)
        assert t["selected_experts"].dtype == np.int64 and tuple(t) == moe_layer_tensor_names()[-7:-1]
        exact[placement] = {n: bool(_exact_in(t[n], "bf16").all()) for n in BLOCK}
        np.testing.assert_allclose(t["routing_weights"].sum(-1), 1.0, atol=2e-2)  # renormalised, maybe rounded
    assert all(exact[p]["experts_out"] and exact[p]["shared_out"] and exact[p]["mlp_out"] for p in PLACEMENTS)
    assert exact["hf"]["router_logits"] and exact["hf"]["routing_weights"]
    assert exact["fla"]["router_logits"] and not exact["fla"]["routing_weights"]  # the top-k kernel's fp32
    assert exact["fp32_once"]["routing_weights"]
    assert not exact["metrale"]["router_logits"] and not exact["metrale"]["routing_weights"]


@pytest.mark.parametrize("profile", ["f32", "bf16", "f16"])
def test_exact_ties_go_to_the_lower_index_in_every_placement(profile):
    """Zero router rows give logits of exactly 0 in every precision: experts 2, 5, 9 tie with each
    other, so with the router rows of experts 0 and 1 set to lift them, the k = 4 slots hold 0, 1
    and the two lowest of the tied ones, in every placement."""
    w = dict(_weights())
    router = np.zeros_like(w[ROUTER])
    router[0, :] = 0.05
    router[1, :] = 0.04
    router[[3, 4, 6, 7, 8] + list(range(10, 16)), :] = -0.05  # below the tie
    w[ROUTER] = router
    h = np.abs(_tokens(6)) + 0.5  # positive: l_0 > l_1 > 0 = l_2 = l_5 = l_9 > the rest
    for placement in PLACEMENTS:
        t = EmulatedLayer(CFG, w, profile=profile, placement=placement).moe_block(store(h, profile))
        assert t["selected_experts"][0].tolist() == [[0, 1, 2, 5]] * 6, placement
    assert R.routing(R.router(h.astype(np.float64), router), K)[1][0].tolist() == [[0, 1, 2, 5]] * 6


def test_f32_placements_match_the_float64_block():
    w, h = _weights(), _tokens(64)
    want = dict(zip(("router_logits", "routing_weights", "selected_experts", "experts_out", "shared_out", "mlp_out"),
                    EmulatedLayer(CFG, w, profile="f32").moe_block(h.astype(np.float64)).values()))
    ref = R.Layer(CFG, w)
    blk = dict(zip(want, R.mlp_moe(h.astype(np.float64), *_reference_args(w, ref))))
    decided = routing_decided(blk["router_logits"], K, "f32")
    assert decided.all()
    for placement in PLACEMENTS:
        t = EmulatedLayer(CFG, w, profile="f32", placement=placement).moe_block(h)
        np.testing.assert_array_equal(t["selected_experts"], blk["selected_experts"])
        for name in BLOCK:
            assert rel_err(t[name], blk[name]) < 2e-6, (placement, name)


def _reference_args(w, ref):
    from gdncheck.experts import EXPERTS_DOWN, EXPERTS_GATE_UP, SHARED_DOWN, SHARED_EXPERT_GATE, SHARED_GATE, SHARED_UP

    Im = CFG.moe_intermediate_size
    return (w[ROUTER], w[EXPERTS_GATE_UP][:, :Im], w[EXPERTS_GATE_UP][:, Im:], w[EXPERTS_DOWN], w[SHARED_GATE],
            w[SHARED_UP], w[SHARED_DOWN], w[SHARED_EXPERT_GATE], K, CFG.norm_topk_prob)


# --- through the port contract ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def sparse_case():
    w = _weights()
    x = make_inputs(CFG, 2, 12, seed=3)
    case = moe_case(CFG, w, x, (0, 11, 12))
    gold = execute(reference_f64, case, profile="f64", capture_state_in=True)
    assert gold.error is None, gold.error
    return case, {**gold.outputs, **gold.state_in}


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_sparse_case_end_to_end_and_stage_isolated(sparse_case, placement):
    """``gdncheck run reference --profile bf16`` as the harness runs it: every call traces the block,
    selected experts as int64; stage by stage from the golden inputs, each of the block's stages
    (and the sparse ``mlp``, the sum) stays near the float64 stage on the tokens routed alike."""
    case, gold = sparse_case
    res = execute(emulated, case, profile="bf16", options={"placement": placement})
    assert res.error is None and res.not_applicable is None, res.error
    for k in (0, 1):
        assert {call_key(k, n) for n in moe_layer_tensor_names()} <= set(res.outputs)
        assert res.outputs[call_key(k, "selected_experts")].dtype == np.int64
    impl = emulated(CFG, case.weights, profile="bf16", placement=placement)
    inputs = {n: gold[call_key(0, n)] for n in ("h_norm", "router_logits", "routing_weights", "selected_experts",
                                                 "experts_out", "shared_out")}
    got = {}
    for stage in ("router", "routing", "experts", "shared_expert", "mlp"):
        got.update(impl.run_stage(stage, inputs))
    decided = routing_decided(inputs["router_logits"], K, "bf16")
    assert decided.mean() > 0.9
    sel, weights = by_expert(got["selected_experts"], got["routing_weights"])
    gold_sel, gold_weights = by_expert(inputs["selected_experts"], inputs["routing_weights"])
    np.testing.assert_array_equal(sel[decided], gold_sel[decided])
    alike = (sel == gold_sel).all(-1)
    want = {name: gold[call_key(0, name)] for name in BLOCK}
    got["routing_weights"], want["routing_weights"] = weights, gold_weights
    for name in BLOCK:
        assert rel_err(got[name][alike], want[name][alike]) < 2e-2, (placement, name)


def test_the_derivation_observes_the_sparse_stages(sparse_case):
    """The tolerance derivation's stage-isolated observation walks a sparse layer's pipeline: it
    records the block's float tensors, and never the selected experts (judged exactly)."""
    case, gold = sparse_case
    env = derive.Envelope()
    impl = emulated(CFG, case.weights, profile="bf16", placement="fla")
    calls = call_steps(case.program)
    names = moe_layer_tensor_names() + ("conv_state", "recurrent_state")
    stats = {n: CaseStats(n, [gold[call_key(s["call"], n)] for s in calls]) for n in names}
    for step in calls:
        derive._observe_isolated(env, impl, gold, {"call": step["call"]}, "bf16", "moe-recipe", stats)
    seen = {key[3] for key in env.elem}
    stages = layer_stage_names("moe")[1:]
    assert seen == {n for s in stages for n in stage_outputs(s, "moe")} - {"selected_experts"}
    assert all(env.elem[("stage_isolated", "bf16", "moe-recipe", n)] > 0 for n in BLOCK)


def test_the_reference_stage_runner_reproduces_its_own_trace(sparse_case):
    """The float64 reference's run_stage (the goldens' stage-isolated mode) on a sparse layer: from
    the golden inputs each of the block's stages gives back the golden tensors (the weights reach
    the right stage functions: the router, the gate/up split, the shared expert, the sum)."""
    case, gold = sparse_case
    impl = reference_f64(CFG, case.weights)
    for stage in ("router", "routing", "experts", "shared_expert", "mlp"):
        inputs = {n: gold[call_key(0, n)] for n in stage_inputs(stage, "moe")}
        for name, value in impl.run_stage(stage, inputs).items():
            np.testing.assert_array_equal(value, gold[call_key(0, name)], err_msg=f"{stage}: {name}")
