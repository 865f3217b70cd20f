"""Every configuration and weight error of docs/spec.md §5: its class, and a message that says what was
expected, what was found and where. (The weight errors a reference layer meets when it is built:
tests/reference/test_layer_checks.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from gdncheck import errors as E
from gdncheck.config import GDNConfig
from gdncheck.synthetic import make_weights
from gdncheck.weights import validate_weights
from tests.helpers import tiny_config

HF = {
    "hidden_size": 8, "intermediate_size": 12, "rms_norm_eps": 1e-6, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 4, "linear_value_head_dim": 3, "linear_conv_kernel_dim": 4,
}


def test_from_hf_reads_every_key():
    cfg = GDNConfig.from_hf(HF)
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_k_heads, cfg.num_v_heads, cfg.head_k_dim,
            cfg.head_v_dim, cfg.conv_kernel, cfg.rms_norm_eps) == (8, 12, 2, 4, 4, 3, 4, 1e-6)
    assert (cfg.key_dim, cfg.value_dim, cfg.conv_dim, cfg.head_ratio) == (8, 12, 28, 2)
    assert cfg.scale == 0.5
    assert GDNConfig.from_hf(cfg.to_hf()) == cfg


def test_from_hf_text_config_and_layer_types():
    cfg = GDNConfig.from_hf({"text_config": {**HF, "num_hidden_layers": 8, "full_attention_interval": 4}})
    assert cfg.layer_type(2) == "linear_attention" and cfg.layer_type(3) == "full_attention"
    with pytest.raises(E.FullAttentionLayerError, match=r"layer_types\[3\] = 'full_attention'.*\[layer 3\]"):
        cfg.check_linear_layer(3)
    with pytest.raises(E.LayerIndexError, match=r"\[0, 8\), found 9"):
        cfg.check_linear_layer(9)


@pytest.mark.parametrize("key", ["linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                 "linear_value_head_dim"])
def test_missing_head_setting(key):
    with pytest.raises(E.MissingHeadSettingError, match=f"missing: {key}"):
        GDNConfig.from_hf({k: v for k, v in HF.items() if k != key})


@pytest.mark.parametrize("key, why", [("hidden_size", ""), ("intermediate_size", " for a dense MLP")])
def test_missing_layer_size(key, why):
    """A dense config without hidden_size or intermediate_size has its own code, in the family of a
    missing key (a port that raises missing_config_key or config_error is still accepted)."""
    with pytest.raises(E.MissingLayerSizeError, match=f"config key '{key}' is required{why}") as err:
        GDNConfig.from_hf({k: v for k, v in HF.items() if k != key})
    assert err.value.code == "missing_layer_size"
    assert isinstance(err.value, E.MissingConfigKeyError) and isinstance(err.value, E.ConfigError)


def test_heads_not_divisible():
    with pytest.raises(E.HeadRatioError, match="found 5 value heads and 2 key heads"):
        GDNConfig.from_hf({**HF, "linear_num_value_heads": 5})


@pytest.mark.parametrize("eps", [0.0, -1e-6, float("nan"), float("inf")])
def test_non_positive_eps(eps):
    with pytest.raises(E.InvalidEpsError, match="rms_norm_eps must be a positive finite number"):
        GDNConfig.from_hf({**HF, "rms_norm_eps": eps})


@pytest.mark.parametrize("alias,mode", [("shared", "shared"), ("per_head", "per_head"), ("per-head", "per_head"),
                                        ("perhead", "per_head"), ("PER_HEAD", "per_head")])
def test_norm_mode_aliases(alias, mode):
    assert GDNConfig.from_hf({**HF, "linear_norm_mode": alias}).norm_mode == mode


def test_unknown_norm_mode():
    with pytest.raises(E.UnknownNormModeError, match="found 'grouped'"):
        GDNConfig.from_hf({**HF, "linear_norm_mode": "grouped"})


def test_projection_sizes_mismatch():
    cfg = tiny_config()
    w = dict(make_weights(cfg))
    w["linear_attn.in_proj_qkv.weight"] = np.zeros((cfg.conv_dim + 4, cfg.hidden_size), np.float32)
    with pytest.raises(E.ProjectionSizeError, match=r"expected in_proj_qkv rows \[Q, K, V\] = \[8, 8, 12\].*found "
                                                     r"shape \[32, 8\]"):
        validate_weights(cfg, w, layer=1)


def test_conv_kernel_contradicts_config():
    cfg = tiny_config(K=4)
    w = dict(make_weights(cfg))
    w["linear_attn.conv1d.weight"] = np.zeros((cfg.conv_dim, 1, 3), np.float32)
    with pytest.raises(E.ConvKernelMismatchError, match="declares linear_conv_kernel_dim=4.*implies 3"):
        validate_weights(cfg, w, layer=0)


def test_other_weight_shape():
    cfg = tiny_config()
    w = dict(make_weights(cfg))
    w["mlp.down_proj.weight"] = np.zeros((cfg.intermediate_size, cfg.hidden_size), np.float32)
    with pytest.raises(E.WeightShapeError, match=r"expected shape \[8, 12\], found \[12, 8\].*mlp.down_proj"):
        validate_weights(cfg, w)


def test_non_finite_weight():
    cfg = tiny_config()
    w = dict(make_weights(cfg))
    w["linear_attn.A_log"] = np.array([0.0, np.nan, 0.0, 0.0], np.float32)
    with pytest.raises(E.WeightError, match="1 NaN/inf"):
        validate_weights(cfg, w)


def test_error_codes_unique_and_resolvable():
    classes = E.all_error_classes()
    codes = [c.code for c in classes]
    assert len(codes) == len(set(codes))
    for cls in classes:
        assert E.error_class_for_code(cls.code) is cls
        assert issubclass(cls, E.GDNError)
