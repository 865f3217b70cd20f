"""The safetensors reader/writer. (A reference state through a snapshot file and back:
tests/reference/test_layer_checks.py.)"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from gdncheck import errors as E
from gdncheck.dtypes import bf16_bits_to_f32, f32_to_bf16_bits, round_to, round_to_common
from gdncheck.safetensors_io import SafetensorsFile, encode_safetensors, read_safetensors, write_safetensors


def test_bf16_rounding_nearest_even():
    # 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to even (1.0)
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, -2.5, 0.0, np.inf], dtype=np.float32)
    got = bf16_bits_to_f32(f32_to_bf16_bits(x))
    np.testing.assert_array_equal(got, [1.0, 1 + 2**-6, -2.5, 0.0, np.inf])
    assert np.isnan(bf16_bits_to_f32(f32_to_bf16_bits(np.array([np.nan], np.float32))))[0]


def test_round_to_common_is_exact_in_both():
    x = np.random.default_rng(0).normal(size=1000) * np.logspace(-8, 5, 1000)
    r = round_to_common(x)
    np.testing.assert_array_equal(round_to(r, "bf16"), r)
    np.testing.assert_array_equal(round_to(r, "f16"), r)


def test_round_trip_all_dtypes(tmp_path):
    rng = np.random.default_rng(1)
    tensors = {"f64": rng.normal(size=(2, 3)), "f32": rng.normal(size=4).astype(np.float32),
               "f16": rng.normal(size=5).astype(np.float16), "i64": np.arange(3),
               "bf": round_to(rng.normal(size=6), "bf16")}
    write_safetensors(tmp_path / "t.safetensors", tensors, {"k": "v"}, dtypes={"bf": "BF16"})
    got, meta = read_safetensors(tmp_path / "t.safetensors")
    assert meta == {"k": "v"}
    for k, v in tensors.items():
        np.testing.assert_array_equal(got[k], v)
    assert SafetensorsFile(tmp_path / "t.safetensors").dtype_of("bf") == "BF16"


def test_writer_is_deterministic_and_aligned():
    t = {"b": np.ones(3), "a": np.zeros((2, 2), np.float32)}
    one = encode_safetensors(t, {"x": "1"})
    two = encode_safetensors(dict(reversed(list(t.items()))), {"x": "1"})
    assert one == two
    (n,) = struct.unpack("<Q", one[:8])
    assert n % 8 == 0
    assert list(json.loads(one[8:8 + n]))[:3] == ["__metadata__", "a", "b"]


def test_bf16_writer_refuses_inexact():
    with pytest.raises(ValueError, match="not exactly representable in bf16"):
        encode_safetensors({"w": np.array([1.0 + 2**-12])}, dtypes={"w": "BF16"})


@pytest.mark.parametrize("damage", ["truncate", "header_len", "bad_json", "bad_dtype", "overlap"])
def test_damaged_files_give_clear_errors(tmp_path, damage):
    path = tmp_path / "t.safetensors"
    data = bytearray(encode_safetensors({"a": np.ones(4), "b": np.ones(4)}))
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    if damage == "truncate":
        data = data[:-5]
    elif damage == "header_len":
        data[:8] = struct.pack("<Q", 10**12)
    elif damage == "bad_json":
        data[8] = ord("!")
    else:
        if damage == "bad_dtype":
            header["a"]["dtype"] = "Q7"
        else:
            header["b"]["data_offsets"] = [8, 40]
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        data = bytearray(struct.pack("<Q", len(text)) + text + data[8 + n:])
    path.write_bytes(bytes(data))
    with pytest.raises(E.SafetensorsFormatError) as info:
        f = SafetensorsFile(path)
        [f[k] for k in f]
    assert str(path) in str(info.value)
