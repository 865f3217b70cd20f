"""The issue's acceptance test: a small Qwen3.5-MoE checkpoint made by transformers itself
(``save_pretrained``: sharded, per-expert names) loads with ``load_layer``, and the float64 reference
layer matches transformers' own decoder layer to fp32 accuracy for a prefill and for decode steps
after it; the same for Qwen3-Next, whose dense and sparse layers mix and whose router may skip the
renormalisation."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers", reason="the hf extra is not installed (pip install -e '.[hf]')")

import torch  # noqa: E402

from gdncheck.checkpoint import load_layer, read_config  # noqa: E402
from gdncheck.reference import Layer, routing_margin  # noqa: E402
from tests.helpers import rel_err, transformers_torch_rules  # noqa: E402

#: fp32 accuracy: transformers computes in float32 (observed ≤ 4e-7 here), the reference in float64
FP32 = 1e-5
#: the smallest gap between a token's k-th and (k+1)-th router logits that these cases allow: far
#: above fp32 rounding of a logit (~1e-7), so both sides must choose the same experts
MIN_LOGIT_MARGIN = 1e-3

SMALL = dict(vocab_size=16, hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
             linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=4,
             moe_intermediate_size=12, shared_expert_intermediate_size=20, num_experts=8, num_experts_per_tok=3)


@pytest.fixture(autouse=True)
def _torch_rules(monkeypatch):
    """transformers' own PyTorch rules, not fla's kernels (which need a GPU) when fla is installed."""
    transformers_torch_rules(monkeypatch)


def _perturb(layer, seed):
    """transformers initialises norm weights to 0 or 1 and the router at std 0.02: give every weight a
    value that a convention error would show in, and the router a spread that keeps tokens off ties."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if "layernorm" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name == "linear_attn.norm.weight":
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif name in ("mlp.gate.weight", "mlp.shared_expert_gate.weight"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def _save(model, path):
    model.save_pretrained(path, max_shard_size="30KB")
    names = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(names.values())) > 1, "the checkpoint should be sharded"
    return names


class Recorder:
    """The sparse block's tensors as transformers computes them (forward hooks)."""

    def __init__(self, block):
        self.out = {}
        block.gate.register_forward_hook(lambda m, i, o: self.out.__setitem__("gate", o))
        block.experts.register_forward_hook(lambda m, i, o: self.out.__setitem__("experts_out", o))
        block.register_forward_hook(lambda m, i, o: self.out.__setitem__("mlp_out", o))


def _compare(hf_layer, config, ref: Layer, top_k: int, splits, seed: int):
    from transformers.cache_utils import DynamicCache

    rec = Recorder(hf_layer.mlp)
    cache = DynamicCache(config=config)
    state = ref.new_state(2)
    x = np.random.default_rng(seed).normal(size=(2, splits[-1], config.hidden_size)).astype(np.float32)
    for start, stop in zip(splits[:-1], splits[1:]):
        T = stop - start
        with torch.no_grad():
            got = hf_layer(torch.from_numpy(x[:, start:stop]), position_embeddings=None, cache=cache)
        out, trace = ref.forward(x[:, start:stop].astype(np.float64), state, start)
        where = f"tokens {start}..{stop - 1}"
        assert routing_margin(trace["router_logits"], top_k)[1].min() > MIN_LOGIT_MARGIN, where
        logits, weights, selected = rec.out["gate"]
        np.testing.assert_array_equal(selected.reshape(2, T, top_k).numpy(), trace["selected_experts"], where)
        assert rel_err(logits.reshape(2, T, -1).numpy(), trace["router_logits"]) < FP32, where
        assert rel_err(weights.reshape(2, T, top_k).numpy(), trace["routing_weights"]) < FP32, where
        assert rel_err(rec.out["experts_out"].reshape(2, T, -1).numpy(), trace["experts_out"]) < FP32, where
        assert rel_err(rec.out["mlp_out"].numpy(), trace["mlp_out"]) < FP32, where
        assert rel_err(got.numpy(), out) < FP32, where
    return trace


def test_qwen35_moe_checkpoint_by_transformers(tmp_path):
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    torch.manual_seed(0)
    config = Qwen3_5MoeTextConfig(**SMALL, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"])
    model = Qwen3_5MoeForCausalLM(config).float().eval()
    _perturb(model.model.layers[0], seed=1)
    names = _save(model, tmp_path)
    assert "model.layers.0.mlp.experts.7.up_proj.weight" in names  # per-expert names, as checkpoints hold them
    assert "intermediate_size" not in json.loads((tmp_path / "config.json").read_text())

    cfg = read_config(tmp_path)
    weights = load_layer(tmp_path, 0)
    ref = Layer(cfg, weights)
    assert ref.mlp_kind == "moe" and cfg.norm_topk_prob
    trace = _compare(model.model.layers[0], config, ref, 3, splits=(0, 9, 10, 11, 12), seed=2)
    assert not np.allclose(trace["routing_weights"].sum(-1), 0.0)


def test_qwen3_next_mixed_layers_by_transformers(tmp_path):
    """mlp_only_layers=[0]: layer 0 dense, layer 1 sparse; norm_topk_prob false; fused projections."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(3)
    config = Qwen3NextConfig(**SMALL, intermediate_size=24, num_hidden_layers=3, mlp_only_layers=[0],
                             norm_topk_prob=False,
                             layer_types=["linear_attention", "linear_attention", "full_attention"])
    model = Qwen3NextForCausalLM(config).float().eval()
    _perturb(model.model.layers[1], seed=4)
    names = _save(model, tmp_path)
    assert "model.layers.1.linear_attn.in_proj_qkvz.weight" in names
    assert "model.layers.0.mlp.gate_proj.weight" in names and "model.layers.1.mlp.experts.0.gate_proj.weight" in names

    cfg = read_config(tmp_path)
    assert [cfg.mlp_kind(i) for i in (0, 1)] == ["dense", "moe"] and not cfg.norm_topk_prob
    assert Layer(cfg, load_layer(tmp_path, 0)).mlp_kind == "dense"
    ref = Layer(cfg, load_layer(tmp_path, 1))
    trace = _compare(model.model.layers[1], config, ref, 3, splits=(0, 7, 8, 9), seed=5)
    assert (trace["routing_weights"].sum(-1) < 0.999).all()  # not renormalised
