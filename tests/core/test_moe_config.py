"""The mixture-of-experts configuration and checkpoint loading: which layers are sparse, the
per-expert and stacked layouts, and every MoE error with its code and a message that says what was
expected, what was found and where."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gdncheck import errors as E
from gdncheck.checkpoint import load_layer
from gdncheck.config import GDNConfig
from gdncheck.experts import EXPERTS_DOWN, EXPERTS_GATE_UP, ROUTER, expert_name, unstack_experts
from gdncheck.safetensors_io import SafetensorsFile
from gdncheck.synthetic import make_weights, write_hf_checkpoint
from gdncheck.weights import validate_weights

#: the text config transformers 5.24 writes for a tiny Qwen3_5MoeForCausalLM (save_pretrained), trimmed
QWEN35_MOE = {
    "model_type": "qwen3_5_moe_text", "hidden_size": 16, "rms_norm_eps": 1e-6, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 4, "linear_value_head_dim": 2, "linear_conv_kernel_dim": 4,
    "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 8, "shared_expert_intermediate_size": 12,
    "layer_types": ["linear_attention", "linear_attention", "full_attention"], "num_hidden_layers": 3,
    "router_aux_loss_coef": 0.001, "output_router_logits": False,
}
QWEN3_NEXT = {**QWEN35_MOE, "model_type": "qwen3_next", "intermediate_size": 20, "decoder_sparse_step": 1,
              "mlp_only_layers": [0], "norm_topk_prob": False}
CFG = GDNConfig.from_hf(QWEN35_MOE)


def test_qwen35_moe_config_without_intermediate_size_loads():
    """The issue's first failure: a Qwen3.5-MoE config has no intermediate_size."""
    cfg = CFG
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size,
            cfg.shared_expert_intermediate_size, cfg.norm_topk_prob) == (6, 2, 8, 12, True)
    assert cfg.intermediate_size is None and cfg.has_experts
    assert [cfg.mlp_kind(i) for i in (0, 1)] == ["moe", "moe"] and cfg.mlp_kind() == "moe"
    assert {k: cfg.dims()[k] for k in ("E", "top_k", "I_moe", "I_shared")} == {"E": 6, "top_k": 2, "I_moe": 8,
                                                                                 "I_shared": 12}
    assert "I" not in cfg.dims()
    assert "E=6 top_k=2 I_moe=8 I_shared=12" in cfg.summary()
    assert GDNConfig.from_hf({**cfg.to_hf(), "model_type": "qwen3_5_moe_text"}) == cfg
    assert "intermediate_size" not in cfg.to_hf() and "norm_topk_prob" not in cfg.to_hf()
    # the VLM config nests it under text_config
    assert GDNConfig.from_hf({"model_type": "qwen3_5_moe", "text_config": QWEN35_MOE}) == cfg


def test_qwen3_next_sparse_layers_follow_transformers_rule():
    cfg = GDNConfig.from_hf(QWEN3_NEXT)
    assert cfg.mlp_only_layers == (0,) and cfg.norm_topk_prob is False and cfg.intermediate_size == 20
    assert [cfg.mlp_kind(i) for i in range(3)] == ["dense", "moe", "moe"]
    step2 = GDNConfig.from_hf({**QWEN3_NEXT, "mlp_only_layers": [], "decoder_sparse_step": 2})
    assert [step2.mlp_kind(i) for i in range(4)] == ["dense", "moe", "dense", "moe"]  # (i + 1) % 2 == 0
    assert GDNConfig.from_hf(cfg.to_hf()) == cfg
    with pytest.raises(E.LayerIndexError, match="mixes sparse and dense MLP layers.*found none"):
        cfg.mlp_kind()
    # Qwen3-Next reads num_experts = 0 as "every MLP dense"
    dense = GDNConfig.from_hf({**QWEN3_NEXT, "num_experts": 0})
    assert not dense.has_experts and dense.mlp_kind(1) == "dense"


def test_dense_layer_without_intermediate_size():
    cfg = GDNConfig.from_hf({k: v for k, v in QWEN3_NEXT.items() if k != "intermediate_size"})
    assert cfg.mlp_kind(1) == "moe"
    with pytest.raises(E.MissingLayerSizeError, match=r"'intermediate_size' is required for the dense MLP of "
                                                      r"layer 0 \(mlp_only_layers=\[0\].*\[layer 0\]"):
        cfg.mlp_kind(0)


@pytest.mark.parametrize("change, error, message", [
    ({"num_experts_per_tok": 7}, E.TopKError, r"integer in \[1, num_experts = 6\], found 7"),
    ({"num_experts_per_tok": 0}, E.TopKError, r"integer in \[1, num_experts = 6\], found 0"),
    ({"num_experts_per_tok": 1.5}, E.TopKError, r"found 1.5"),
    ({"num_experts_per_tok": None}, E.MissingConfigKeyError,
     r"'num_experts_per_tok' is required for a mixture-of-experts block \(num_experts is set\), found it missing"),
    ({"num_experts": 0}, E.ExpertCountError, r"num_experts >= 1.*'qwen3_5_moe_text' has one in every layer"),
    ({"num_experts": -2}, E.ExpertCountError, r"non-negative integer, found -2"),
    ({"moe_intermediate_size": None}, E.MissingConfigKeyError, r"'moe_intermediate_size' is required"),
    ({"shared_expert_intermediate_size": 0}, E.ConfigError, r"positive integer, found 0"),
    ({"norm_topk_prob": False}, E.MoEConfigError, r"always renormalises.*norm_topk_prob must be absent or true"),
    ({"mlp_only_layers": [1]}, E.MoEConfigError, r"mlp_only_layers must be absent or \[\], found \[1\]"),
    ({"decoder_sparse_step": 2}, E.MoEConfigError, r"decoder_sparse_step must be absent or 1, found 2"),
])
def test_moe_config_errors(change, error, message):
    with pytest.raises(error, match=message):
        GDNConfig.from_hf({**QWEN35_MOE, **change})


def test_moe_config_errors_qwen3_next():
    with pytest.raises(E.ExpertCountError, match="or an intermediate_size for a dense MLP"):
        GDNConfig.from_hf({k: v for k, v in {**QWEN3_NEXT, "num_experts": 0}.items() if k != "intermediate_size"})
    with pytest.raises(E.MoEConfigError, match=r"mlp_only_layers must be a list of layer indices, found 'x'"):
        GDNConfig.from_hf({**QWEN3_NEXT, "mlp_only_layers": "x"})
    with pytest.raises(E.MoEConfigError, match="norm_topk_prob must be true or false, found 'yes'"):
        GDNConfig.from_hf({**QWEN3_NEXT, "norm_topk_prob": "yes"})
    with pytest.raises(E.MoEConfigError, match="expected num_experts with moe_intermediate_size"):
        CFG.replace(num_experts=None, intermediate_size=8, num_experts_per_tok=None)
    with pytest.raises(E.TopKError, match=r"\[1, num_experts = 6\], found 9"):
        CFG.replace(num_experts_per_tok=9)


def test_error_codes():
    codes = {cls.code for cls in E.all_error_classes()}
    assert {"moe_config", "expert_count", "moe_top_k", "missing_expert", "expert_layout"} <= codes
    assert issubclass(E.MissingExpertError, E.MissingWeightError) and issubclass(E.TopKError, E.ConfigError)


# --- loading ---------------------------------------------------------------------------------------


def _weights(seed=0):
    return {0: make_weights(CFG, seed=seed), 1: make_weights(CFG, seed=seed + 1)}


@pytest.mark.parametrize("layout", ["per_expert", "stacked"])
@pytest.mark.parametrize("shards", [1, 4])
def test_moe_checkpoint_round_trip(tmp_path, layout, shards):
    layers = _weights()
    write_hf_checkpoint(tmp_path, CFG, layers, prefix="model.layers.{i}.", shards=shards, expert_layout=layout,
                        dtypes={EXPERTS_DOWN: "F16"})
    names = set()
    for f in tmp_path.glob("*.safetensors"):
        names |= set(SafetensorsFile(f))
    per_expert = "model.layers.1.mlp.experts.5.down_proj.weight" in names
    assert per_expert == (layout == "per_expert")
    assert ("model.layers.1.mlp.experts.gate_up_proj" in names) == (layout == "stacked")
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen3_5_moe_text"
    got = load_layer(tmp_path, 1)
    assert set(got) == set(layers[1])
    for name, arr in layers[1].items():
        np.testing.assert_array_equal(got[name], arr, err_msg=name)
    assert got[EXPERTS_GATE_UP].shape == (6, 16, 16) and got[EXPERTS_DOWN].shape == (6, 16, 8)
    assert got.stored_dtypes[EXPERTS_DOWN] == "F16" and got.stored_dtypes[EXPERTS_GATE_UP] == "BF16"


def test_stacking_puts_gate_before_up():
    """Expert e's gate_up_proj rows: [gate (I_moe) | up (I_moe)], as transformers' chunk(2) reads them."""
    w = dict(make_weights(CFG))
    per = unstack_experts(CFG, w)
    e = 4
    np.testing.assert_array_equal(per[expert_name(e, "gate_proj")], w[EXPERTS_GATE_UP][e, :8])
    np.testing.assert_array_equal(per[expert_name(e, "up_proj")], w[EXPERTS_GATE_UP][e, 8:])
    np.testing.assert_array_equal(per[expert_name(e, "down_proj")], w[EXPERTS_DOWN][e])


def _write_per_expert(tmp_path, edit):
    """A per-expert checkpoint of layer 0 whose tensors ``edit`` changes (name -> array, in place)."""
    w = unstack_experts(CFG, make_weights(CFG))
    edit(w)
    tensors = {f"model.layers.0.{k}": np.asarray(v, np.float32) for k, v in w.items()}
    from gdncheck.safetensors_io import write_safetensors

    write_safetensors(tmp_path / "model.safetensors", tensors, {"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps(QWEN35_MOE))
    return tmp_path


def test_missing_expert_is_named(tmp_path):
    _write_per_expert(tmp_path, lambda w: w.pop(expert_name(3, "up_proj")))
    with pytest.raises(E.MissingExpertError, match=r"expected 6 experts x 3 projections, missing 1: "
                                                   r"mlp.experts.3.up_proj.weight \[layer 0, "
                                                   r"'mlp.experts.3.up_proj.weight'\]"):
        load_layer(tmp_path, 0)


def test_expert_beyond_num_experts(tmp_path):
    _write_per_expert(tmp_path, lambda w: w.update({expert_name(6, "gate_proj"): w[expert_name(0, "gate_proj")]}))
    with pytest.raises(E.ExpertLayoutError, match=r"num_experts=6 \(experts 0..5\), found tensors of expert 6"):
        load_layer(tmp_path, 0)


def test_both_layouts_refused(tmp_path):
    stacked = make_weights(CFG)
    _write_per_expert(tmp_path, lambda w: w.update({EXPERTS_DOWN: stacked[EXPERTS_DOWN]}))
    with pytest.raises(E.ExpertLayoutError, match=r"one layout.*found both \(18 per-expert tensors and "
                                                  r"mlp.experts.down_proj\)"):
        load_layer(tmp_path, 0)


def test_expert_wrong_shape(tmp_path):
    _write_per_expert(tmp_path, lambda w: w.update({expert_name(2, "down_proj"): np.zeros((16, 9), np.float32)}))
    with pytest.raises(E.WeightShapeError, match=r"expected expert shape \[16, 8\] \[hidden_size, "
                                                 r"moe_intermediate_size\], found \[16, 9\] \[layer 0, "
                                                 r"'mlp.experts.2.down_proj.weight'\]"):
        load_layer(tmp_path, 0)


@pytest.mark.parametrize("name, shape, words", [
    (ROUTER, (5, 16), r"expected shape \[6, 16\] \[num_experts, hidden_size\], found \[5, 16\]"),
    (EXPERTS_GATE_UP, (6, 8, 16), r"\[6, 16, 16\] \[num_experts, 2 \* moe_intermediate_size, hidden_size\]"),
    ("mlp.shared_expert_gate.weight", (16,), r"expected shape \[1, 16\] \[1, hidden_size\], found \[16\]"),
])
def test_stacked_wrong_shape(name, shape, words):
    w = dict(make_weights(CFG))
    w[name] = np.zeros(shape, np.float32)
    with pytest.raises(E.WeightShapeError, match=words):
        validate_weights(CFG, w, layer=1)


def test_missing_router_and_dense_weights_for_moe_layer():
    w = dict(make_weights(CFG))
    del w[ROUTER]
    with pytest.raises(E.MissingWeightError, match=r"with a mixture-of-experts block, missing 1: mlp.gate.weight"):
        validate_weights(CFG, w, layer=0)
    with pytest.raises(E.MissingWeightError, match=r"stack them with gdncheck.experts.stack_experts"):
        validate_weights(CFG, unstack_experts(CFG, make_weights(CFG)), layer=0)


def test_qwen3_next_mixed_checkpoint(tmp_path):
    """Layer 0 dense (mlp_only_layers), layer 1 sparse, the fused Qwen3-Next projections."""
    cfg = GDNConfig.from_hf(QWEN3_NEXT)
    layers = {0: make_weights(cfg, seed=3, layer=0), 1: make_weights(cfg, seed=4, layer=1)}
    assert "mlp.gate_proj.weight" in layers[0] and ROUTER in layers[1]
    write_hf_checkpoint(tmp_path, cfg, layers, prefix="model.layers.{i}.", layout="qwen3_next", shards=2)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen3_next"
    for i in (0, 1):
        got = load_layer(tmp_path, i)
        assert set(got) == set(layers[i])
        for name, arr in layers[i].items():
            np.testing.assert_array_equal(got[name], arr, err_msg=name)
