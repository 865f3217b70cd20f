"""Loading one GDN layer from small Hugging Face checkpoints written by the test itself."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gdncheck import errors as E
from gdncheck.checkpoint import load_layer
from gdncheck.dtypes import round_to
from gdncheck.synthetic import make_weights, write_hf_checkpoint
from tests.helpers import tiny_config

CFG = tiny_config(Hk=2, Hv=6, dk=4, dv=2)


def _layers(n=3, seed=0):
    return {i: make_weights(CFG, seed=seed + i) for i in range(n)}


@pytest.mark.parametrize("prefix", ["model.language_model.layers.{i}.", "model.layers.{i}."])
@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("dtype", ["BF16", "F32", "F16"])
def test_round_trip(tmp_path, prefix, shards, dtype):
    layers = _layers()
    dtypes = {n: dtype for n in layers[0]}
    write_hf_checkpoint(tmp_path, CFG, layers, prefix=prefix, shards=shards, dtypes=dtypes)
    if shards > 1:
        index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) == shards
    for i in (0, 2):
        got = load_layer(tmp_path, i)
        assert got.layer == i and got.config == CFG
        for name, arr in layers[i].items():
            np.testing.assert_array_equal(got[name], arr, err_msg=name)  # exact: values are bf16/f16-exact
            assert got.stored_dtypes[name] == dtype


def test_bf16_read_exactly(tmp_path):
    w = dict(make_weights(CFG))
    w["linear_attn.dt_bias"] = round_to(np.array([1.00390625, -3.140625, 1e-3, 7.0, 0.5, 2.0]), "bf16")
    write_hf_checkpoint(tmp_path, CFG, {0: w})
    got = load_layer(tmp_path, 0)
    np.testing.assert_array_equal(got["linear_attn.dt_bias"], w["linear_attn.dt_bias"].astype(np.float32))
    assert got.stored_dtypes["linear_attn.dt_bias"] == "BF16"
    assert got.stored_dtypes["linear_attn.A_log"] == "F32"  # Qwen3.5 keeps A_log in f32


def test_qwen3_next_fused_layout_converted(tmp_path):
    layers = _layers(2, seed=7)
    write_hf_checkpoint(tmp_path, CFG, layers, prefix="model.layers.{i}.", layout="qwen3_next")
    from gdncheck.safetensors_io import SafetensorsFile

    names = set(SafetensorsFile(tmp_path / "model.safetensors"))
    assert "model.layers.1.linear_attn.in_proj_qkvz.weight" in names
    assert "model.layers.1.linear_attn.in_proj_qkv.weight" not in names
    got = load_layer(tmp_path, 1)
    for name, arr in layers[1].items():
        np.testing.assert_array_equal(got[name], arr, err_msg=name)


def test_qwen3_next_interleave_by_hand(tmp_path):
    """The fused qkvz rows of key group g are [q_g (dk) | k_g (dk) | v of heads g*r..g*r+r-1 | z of same]."""
    cfg = tiny_config(Hk=2, Hv=4, dk=1, dv=1, D=1, I=1, K=1)
    r = 2
    fused = np.arange(2 * (2 + 2 * r), dtype=np.float32).reshape(-1, 1)  # group0: 0..5, group1: 6..11
    ba = np.arange(2 * 2 * r, dtype=np.float32).reshape(-1, 1)
    w = {n: v for n, v in make_weights(cfg).items() if "in_proj" not in n}
    from gdncheck.safetensors_io import write_safetensors

    tensors = {f"model.layers.0.{k}": v for k, v in w.items()}
    tensors["model.layers.0.linear_attn.in_proj_qkvz.weight"] = fused
    tensors["model.layers.0.linear_attn.in_proj_ba.weight"] = ba
    write_safetensors(tmp_path / "model.safetensors", tensors)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf()))
    got = load_layer(tmp_path, 0)
    # q = [0, 6], k = [1, 7], v = [2, 3, 8, 9], z = [4, 5, 10, 11]
    np.testing.assert_array_equal(got["linear_attn.in_proj_qkv.weight"].ravel(), [0, 6, 1, 7, 2, 3, 8, 9])
    np.testing.assert_array_equal(got["linear_attn.in_proj_z.weight"].ravel(), [4, 5, 10, 11])
    # ba groups: [b0 b1 a0 a1 | b2 b3 a2 a3] = [0 1 2 3 | 4 5 6 7]
    np.testing.assert_array_equal(got["linear_attn.in_proj_b.weight"].ravel(), [0, 1, 4, 5])
    np.testing.assert_array_equal(got["linear_attn.in_proj_a.weight"].ravel(), [2, 3, 6, 7])


def test_full_attention_layer_refused(tmp_path):
    cfg = tiny_config(layer_types=("linear_attention", "linear_attention", "linear_attention", "full_attention"))
    write_hf_checkpoint(tmp_path, cfg, {0: make_weights(cfg)}, num_layers=4)
    with pytest.raises(E.FullAttentionLayerError, match=r"layer_types\[3\] = 'full_attention'.*GDN layers are "
                                                         r"\[0, 1, 2\]"):
        load_layer(tmp_path, 3)


def test_missing_layer_and_missing_weight(tmp_path):
    layers = _layers(1)
    w = dict(layers[0])
    del w["mlp.up_proj.weight"]
    write_hf_checkpoint(tmp_path, CFG, {0: w}, num_layers=2)
    with pytest.raises(E.MissingWeightError, match="mlp.up_proj.weight"):
        load_layer(tmp_path, 0)
    with pytest.raises(E.CheckpointError, match="model.language_model.layers.1."):
        load_layer(tmp_path, 1)


def test_checkpoint_errors(tmp_path):
    with pytest.raises(E.CheckpointError, match="found nothing"):
        load_layer(tmp_path / "nope", 0)
    tmp_path.joinpath("config.json").write_text(json.dumps(CFG.to_hf()))
    with pytest.raises(E.CheckpointError, match="model.safetensors or model.safetensors.index.json"):
        load_layer(tmp_path, 0)
    tmp_path.joinpath("model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.layers.0.mlp.up_proj.weight": "../evil.safetensors"}}))
    with pytest.raises(E.CheckpointError, match="points outside"):
        load_layer(tmp_path, 0)
