"""The core read from untrusted files (issue 11, items 5-7): any JSON value in any config key is a
ConfigError naming the key; absurd sizes are refused with the bound they broke; a checkpoint index
of the wrong shape, a snapshot file that breaks the contract, a safetensors header of the wrong
types: each a GDNError with a code and a message, never a bare Python or NumPy error."""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest

from gdncheck import errors as E
from gdncheck.checkpoint import load_layer, read_config
from gdncheck.config import GDNConfig
from gdncheck.safetensors_io import SafetensorsFile, encode_safetensors, write_safetensors
from gdncheck.snapshot import Snapshot

BASE = {"hidden_size": 16, "intermediate_size": 32, "rms_norm_eps": 1e-6, "linear_num_key_heads": 1,
        "linear_num_value_heads": 2, "linear_key_head_dim": 4, "linear_value_head_dim": 4, "linear_conv_kernel_dim": 4}
#: every kind of JSON value, and numbers a config must refuse
VALUES = [math.inf, -math.inf, math.nan, -1, 0, 2.5, 10 ** 30, 1e300, "4", "x", [], [4], {}, {"a": 4}, True, False]
#: the sizes a config may not make absurd (SIZE_BOUNDS)
SIZE_KEYS = ("hidden_size", "intermediate_size", "linear_num_key_heads", "linear_num_value_heads",
             "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "num_experts",
             "moe_intermediate_size")
KEYS = [*BASE, "linear_norm_mode", "layer_types", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
        "norm_topk_prob", "mlp_only_layers"]


@pytest.mark.parametrize("key", KEYS)
def test_any_json_value_in_any_key_is_a_config_error_naming_it(key):
    for value in VALUES:
        cfg = {**BASE, key: value}
        if key.startswith(("num_experts_per", "moe_", "norm_topk", "mlp_only")):
            cfg.update({"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
                        "shared_expert_intermediate_size": 8, key: value})
        try:
            GDNConfig.from_hf(cfg)
            assert not (key in SIZE_KEYS and value in (10 ** 30, 1e300)), f"{key}={value!r} accepted"
        except E.ConfigError as exc:
            words = {key, key.replace("linear_", ""), "eps", "norm_mode", "head", "num_experts", "intermediate"}
            assert any(w in str(exc) for w in words), (key, value, str(exc))
        except Exception as exc:  # noqa: BLE001 - the assertion is that nothing else escapes
            pytest.fail(f"{key}={value!r}: {type(exc).__name__}: {exc}")


def test_layer_count_keys_are_checked_and_bounded():
    for extra in ({"full_attention_interval": 4, "num_hidden_layers": math.inf},
                  {"full_attention_interval": "x", "num_hidden_layers": 4},
                  {"full_attention_interval": 4, "num_hidden_layers": 10 ** 12}, {"layer_types": 5},
                  {"layer_types": ["linear_attention", 3]}):
        with pytest.raises(E.ConfigError, match="num_hidden_layers|full_attention_interval|layer_types"):
            GDNConfig.from_hf({**BASE, **extra})


def test_absurd_sizes_are_refused_with_the_bound_they_broke():
    with pytest.raises(E.ConfigError, match=r"hidden_size must be at most 131072"):
        GDNConfig.from_hf({**BASE, "hidden_size": 1e300})
    with pytest.raises(E.ConfigError, match=r"state would hold .* elements .* bound 268435456"):
        GDNConfig.from_hf({**BASE, "linear_num_key_heads": 64, "linear_num_value_heads": 64,
                           "linear_key_head_dim": 4096, "linear_value_head_dim": 4096})
    with pytest.raises(E.ConfigError, match=r"weights D·I .* bound"):
        GDNConfig.from_hf({**BASE, "hidden_size": 1 << 17, "intermediate_size": 1 << 20})
    big = GDNConfig.from_hf({**BASE, "hidden_size": 8192, "intermediate_size": 32768, "linear_num_key_heads": 16,
                             "linear_num_value_heads": 64, "linear_key_head_dim": 256, "linear_value_head_dim": 256})
    assert big.value_dim == 16384  # real sizes pass


def test_checkpoint_files_of_the_wrong_shape(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.mkdir()
    with pytest.raises(E.CheckpointError, match="found a folder"):
        read_config(tmp_path)
    cfg.rmdir()
    cfg.write_text(json.dumps({**BASE, "linear_num_key_heads": math.nan}).replace("NaN", "NaN"))
    with pytest.raises(E.ConfigError, match="linear_num_key_heads"):
        read_config(tmp_path)
    cfg.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(E.CheckpointError, match="nested too deep|JSON"):
        read_config(tmp_path)
    cfg.write_text(json.dumps(BASE))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["a", "b"]}))
    with pytest.raises(E.CheckpointError, match="weight_map"):
        load_layer(tmp_path, 0)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": 5}}))
    with pytest.raises(E.CheckpointError, match="weight_map"):
        load_layer(tmp_path, 0)


def _snapshot(tmp_path, **change) -> Snapshot:
    cfg = GDNConfig.from_hf(BASE)
    snap = Snapshot(np.zeros((2, cfg.conv_dim, 4)), np.zeros((2, 2, 4, 4), np.float32), np.array([3, 5]),
                    cfg.state_fingerprint())
    for k, v in change.items():
        setattr(snap, k, v)
    return snap


def _resave(path, tensors: dict, meta_change: dict) -> None:
    f = SafetensorsFile(path)
    data = {k: f.read(k) for k in f}
    data.update(tensors)
    meta = {**f.metadata, **meta_change}
    import gdncheck.snapshot as S

    meta["sha256"] = S._digest({k: data[k] for k in ("conv_state", "recurrent_state", "seq_len")})
    write_safetensors(path, data, meta)


def test_a_snapshot_file_is_bound_to_its_tensors(tmp_path):
    cfg = GDNConfig.from_hf(BASE)
    other = GDNConfig.from_hf({**BASE, "linear_value_head_dim": 8})
    path = _snapshot(tmp_path).save(tmp_path / "s.safetensors")
    assert Snapshot.load(path).fingerprint == cfg.state_fingerprint()
    # a fingerprint rewritten to another config's: refused on load, whatever the sha256 says
    _resave(path, {}, {"fingerprint": other.state_fingerprint()})
    with pytest.raises(E.SnapshotCorruptError, match="not that of the file's own arrays"):
        Snapshot.load(path)
    # restoring arrays of other dimensions under the right fingerprint is refused too
    snap = _snapshot(tmp_path, recurrent_state=np.zeros((2, 2, 4, 8), np.float32))
    with pytest.raises(E.SnapshotDimensionError, match="other dimensions"):
        snap.check_compatible(cfg.state_fingerprint(), 2)
    for tensors, words in [({"seq_len": np.array([-1, 5])}, "negative"),
                           ({"recurrent_state": np.full((2, 2, 4, 4), np.nan, np.float32)}, "NaN"),
                           ({"conv_state": np.zeros((2, cfg.conv_dim, 4), np.int32)}, "conv_state is I32"),
                           ({"seq_len": np.array([1.0, 2.0])}, "seq_len is F64")]:
        path = _snapshot(tmp_path).save(tmp_path / "s.safetensors")
        _resave(path, tensors, {})
        with pytest.raises(E.SnapshotCorruptError, match=words):
            Snapshot.load(path)


@pytest.mark.parametrize("entry", [{"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]},
                                   {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]},
                                   {"dtype": "F32", "shape": [1], "data_offsets": [0.0, 4]},
                                   {"dtype": "F32", "shape": [10 ** 30, 0], "data_offsets": [0, 0]},
                                   {"dtype": "F32", "shape": [2 ** 31, 2 ** 31], "data_offsets": [0, 4]},
                                   [1, 2], "F32"])
def test_a_safetensors_header_of_the_wrong_types(tmp_path, entry):
    text = json.dumps({"t": entry}).encode()
    text += b" " * (-len(text) % 8)
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * 4)
    with pytest.raises(E.SafetensorsFormatError, match=r"tensor 't'.*expected"):
        SafetensorsFile(path)


def test_every_error_of_the_api_is_a_gdn_error(tmp_path):
    path = write_safetensors(tmp_path / "x.safetensors", {"a": np.zeros(3, np.float32)})
    f = SafetensorsFile(path)
    with pytest.raises(E.GDNError) as exc:
        f["missing"]
    assert isinstance(exc.value, KeyError) and exc.value.code == "tensor_not_found"
    assert "missing" not in f and "a" in f
    with pytest.raises(E.GDNError) as exc:
        encode_safetensors({"a": np.array([1.1], np.float64)}, dtypes={"a": "BF16"})
    assert isinstance(exc.value, ValueError) and exc.value.code == "safetensors_encode"
    with pytest.raises(E.GDNError):
        encode_safetensors({"a": np.zeros(1)}, dtypes={"a": "F128"})
    with pytest.raises(E.GDNError, match="is a folder"):
        write_safetensors(tmp_path, {"a": np.zeros(1)})
    with pytest.raises(E.SnapshotError):
        Snapshot.load(tmp_path)


@pytest.mark.parametrize("layer", [-1, "0", 1.0, True, None])
def test_a_layer_index_that_is_no_index_is_refused_before_any_file_is_read(tmp_path, layer):
    from gdncheck.checkpoint import load_layer

    with pytest.raises(E.LayerIndexError, match=r"expected a layer index \(a non-negative integer\), found"):
        load_layer(tmp_path / "no-such-checkpoint", layer)


def test_one_line_keeps_a_message_quoting_a_huge_file_readable():
    from gdncheck.untrusted import MAX_LINE, one_line

    text = one_line("found '" + "[" * 200000 + "\n]'")
    assert len(text) < MAX_LINE + 100 and "\n" not in text and "characters left out" in text
    assert text.startswith("found '[[[") and text.endswith("\\n]'")
    assert one_line("short\r") == "short\\r"


@pytest.mark.parametrize("kind", ["device", "pipe", "folder", "large"])
def test_read_bounded_refuses_what_never_ends_or_never_comes(tmp_path, kind):
    """A path given on the command line (a tolerance table, a summary, a known-failures file) read
    whole: /dev/zero never ends, a pipe may never be written; both are refused before a read."""
    import os

    from gdncheck.untrusted import UnsafePathError, read_bounded

    path = tmp_path / "x"
    if kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "pipe":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path.write_bytes(b"0" * 101)
    with pytest.raises(UnsafePathError, match="expected a file|expected at most 100 bytes, found 101"):
        read_bounded(path, 100, "table")
    (tmp_path / "y").write_bytes(b"0" * 100)
    assert read_bounded(tmp_path / "y", 100) == b"0" * 100
