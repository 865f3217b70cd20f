"""Weights as a released Qwen3.5 checkpoint holds them (issue 44): A_log and the gated norm's weight as
float32 values no half dtype represents, the rest bf16; a checkpoint's float32 values are read back bit
for bit, in their stored dtype."""

from __future__ import annotations

import numpy as np

from gdncheck.checkpoint import load_layer
from gdncheck.config import GDNConfig
from gdncheck.dtypes import round_to
from gdncheck.synthetic import CHECKPOINT_F32, not_half_exact, realistic_weights, write_hf_checkpoint

CFG = GDNConfig(hidden_size=32, intermediate_size=48, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16)


def _changed_by(arr, dtype) -> np.ndarray:
    v = np.asarray(arr, dtype=np.float32).astype(np.float64)
    return round_to(v, dtype) != v


def test_f32_weights_are_no_half_dtype_value_and_the_rest_is_the_same_draw():
    plain = realistic_weights(CFG, 5)
    f32 = realistic_weights(CFG, 5, f32=CHECKPOINT_F32)
    for name in plain:
        if name in CHECKPOINT_F32:
            for dtype in ("bf16", "f16"):  # every element moves when a port rounds it at load
                assert _changed_by(f32[name], dtype).all(), (name, dtype)
            assert f32.stored_dtypes[name] == "F32"
            # the same draw, to float32 precision: rounded to bf16/f16 it is plain's value (or a neighbour)
            assert np.allclose(f32[name], plain[name], rtol=2.0 ** -7, atol=0)
        else:
            assert np.array_equal(np.asarray(f32[name]).view(np.uint32), np.asarray(plain[name]).view(np.uint32)), name
            assert f32.stored_dtypes[name] == "BF16"


def test_not_half_exact_moves_exact_values_one_float32_ulp_away_from_zero():
    x = np.array([1.0, -2.5, 0.1, 1.0 + 2.0 ** -20, 3.0e-8], dtype=np.float64)
    got = not_half_exact(x)
    assert got.dtype == np.float32
    assert got[0] == np.nextafter(np.float32(1.0), np.float32(2.0))
    assert got[1] == np.nextafter(np.float32(-2.5), np.float32(-3.0))
    assert got[2] == np.float32(0.1) and got[3] == np.float32(1.0 + 2.0 ** -20)  # neither dtype holds them
    assert _changed_by(got, "bf16").all() and _changed_by(got, "f16").all()


def test_load_layer_keeps_a_checkpoints_float32_values_and_dtypes(tmp_path):
    w = realistic_weights(CFG, 9, f32=CHECKPOINT_F32)
    write_hf_checkpoint(tmp_path, CFG, {0: w})
    got = load_layer(tmp_path, 0)
    for name in CHECKPOINT_F32:
        assert got.stored_dtypes[name] == "F32"
        assert np.asarray(got[name]).dtype == np.float32
        assert np.array_equal(np.asarray(got[name]).view(np.uint32), np.asarray(w[name]).view(np.uint32)), name
    assert got.stored_dtypes["linear_attn.dt_bias"] == "BF16"  # as released: dt_bias is bf16
