"""The stage vocabulary of a layer with the sparse block (gdncheck/stages.py): one vocabulary for both
layer kinds, in which the dense layer's names, orders and indices are exactly what they were."""

from __future__ import annotations

import pytest

from gdncheck import stages as S
from gdncheck.experts import mlp_kind_of
from gdncheck.synthetic import make_weights
from tests.helpers import tiny_config

#: the dense pipeline as docs/spec.md §2 numbers it (written out: the vocabulary must not drift)
DENSE_ORDER = ("x", "x_norm", "qkv", "z", "a", "b", "qkv_conv", "conv_state", "q", "k", "v", "g", "beta", "core",
               "recurrent_state", "core_gated", "attn_out", "h", "h_norm", "mlp_out", "out")
BLOCK = ("router_logits", "routing_weights", "selected_experts", "experts_out", "shared_out")


def test_the_dense_vocabulary_is_unchanged():
    assert S.TENSOR_ORDER == DENSE_ORDER
    assert S.layer_tensor_order("dense") is S.TENSOR_ORDER and S.layer_stages("dense") is S.STAGES
    assert S.STAGE_NAMES == ("input", "input_norm", "in_proj", "conv1d", "qk_norm", "gates", "delta_rule",
                             "gated_norm", "out_proj", "residual", "post_norm", "mlp", "output")
    assert [S.stage_index(s) for s in S.STAGE_NAMES] == list(range(13)) and S.stage_index(S.STATE_STAGE) == 13
    assert S.STAGE_INPUTS["mlp"] == ("h_norm",) and S.stage_inputs("mlp") == ("h_norm",)
    assert not any(name in S.TENSOR_BY_NAME for name in BLOCK)
    assert S.REQUIRED_OUTPUTS == ("out", "conv_state", "recurrent_state")
    # the ranks keep the dense order, and the stage ranks order the dense stages as their indices do
    assert sorted(DENSE_ORDER, key=S.tensor_rank) == list(DENSE_ORDER)
    assert sorted(S.STAGE_NAMES, key=S.stage_rank) == list(S.STAGE_NAMES)


def test_a_sparse_layer_pipeline():
    names = S.layer_stage_names("moe")
    assert names[names.index("post_norm"):] == ("post_norm", "router", "routing", "experts", "shared_expert", "mlp",
                                                "output")
    order = S.layer_tensor_order("moe")
    assert order == DENSE_ORDER[:19] + BLOCK + ("mlp_out", "out")
    assert tuple(t.name for t in S.layer_tensors("moe")) == S.moe_layer_tensor_names()
    mlp = S.layer_stage("mlp", "moe")
    assert mlp.inputs == ("experts_out", "shared_out") and mlp.outputs == ("mlp_out",)
    assert mlp.function_name == "moe_sum" and S.layer_stage("mlp").function_name == "mlp"
    assert S.stage_inputs("experts", "moe") == ("h_norm", "routing_weights", "selected_experts")
    assert S.stage_outputs("routing", "moe") == ("routing_weights", "selected_experts")
    with pytest.raises(KeyError, match="not a stage of a dense layer"):
        S.layer_stage("router", "dense")
    with pytest.raises(ValueError, match="mlp_kind must be one of dense, moe"):
        S.layer_stages("sparse")


def test_names_of_either_kind_resolve():
    assert [S.stage_of(n) for n in BLOCK] == ["router", "routing", "routing", "experts", "shared_expert"]
    assert all(S.stage_index(S.stage_of(n)) == 11 for n in BLOCK)  # the parts of docs/spec.md §2's stage 11
    # first-divergence order inside stage 11: the block's tensors before mlp_out, mlp_out before out
    ranked = sorted(["out", "mlp_out", "shared_out", "router_logits", "h_norm", "experts_out"], key=S.tensor_rank)
    assert ranked == ["h_norm", "router_logits", "experts_out", "shared_out", "mlp_out", "out"]
    assert S.stage_rank("post_norm") < S.stage_rank("router") < S.stage_rank("shared_expert") < \
        S.stage_rank("mlp") < S.stage_rank("output") < S.stage_rank(S.STATE_STAGE)
    assert S.KNOWN_TENSORS["routing_weights"].shape == ("T", "top_k")
    with pytest.raises(KeyError, match="router_logits"):  # the message lists the block's names too
        S.stage_of("logits")


def test_selected_experts_are_integers_judged_exactly():
    assert S.INDEX_TENSORS == ("selected_experts",) and S.is_index_tensor("selected_experts")
    assert S.KNOWN_TENSORS["selected_experts"].is_index
    assert not any(S.is_index_tensor(n) for n in DENSE_ORDER + ("router_logits", "routing_weights"))


def test_the_weights_say_the_kind():
    cfg = tiny_config(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=6, shared_expert_intermediate_size=5,
                      mlp_only_layers=(0,))
    assert mlp_kind_of(make_weights(cfg, layer=0)) == "dense" and mlp_kind_of(make_weights(cfg, layer=1)) == "moe"
