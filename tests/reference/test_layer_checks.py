"""The core's checks as the float64 reference layer meets them: a layer built from weights of the
wrong norm mode or size, or missing one, refuses them with the error of docs/spec.md §5 (the core's
weights.py, tests/core/test_config_errors.py for the rest); a reference state saved as a snapshot file
and restored continues bit for bit, and a damaged snapshot file, or one of other dimensions, never
reaches the layer (the core's snapshot.py, tests/core/test_safetensors_snapshot.py and
test_untrusted_inputs.py for the file format)."""

from __future__ import annotations

import numpy as np
import pytest

from gdncheck import errors as E
from gdncheck.config import GDNConfig
from gdncheck.reference import Layer
from gdncheck.safetensors_io import SafetensorsFile, write_safetensors
from gdncheck.snapshot import Snapshot
from gdncheck.synthetic import make_inputs, make_weights
from tests.core.test_untrusted_inputs import BASE, _resave, _snapshot
from tests.helpers import tiny_config


# --- weights (tests/core/test_config_errors.py) ---------------------------------------------------------
def test_norm_mode_inferred_from_weight():
    cfg = tiny_config()
    assert Layer(cfg, make_weights(cfg, norm_mode="shared")).norm_mode == "shared"
    assert Layer(cfg, make_weights(cfg, norm_mode="per_head")).norm_mode == "per_head"


@pytest.mark.parametrize("declared,weight_mode,inferred", [("shared", "per_head", "per_head"),
                                                            ("per_head", "shared", "shared")])
def test_declared_norm_mode_contradicts_weight(declared, weight_mode, inferred):
    cfg = tiny_config(norm_mode=declared)
    w = make_weights(cfg, norm_mode=weight_mode)
    with pytest.raises(E.NormModeConflictError) as info:
        Layer(cfg, w, layer_index=5)
    msg = str(info.value)
    assert f"declared linear_norm_mode='{declared}'" in msg and f"imply '{inferred}'" in msg
    assert "layer 5" in msg and "linear_attn.norm.weight" in msg


def test_norm_weight_of_neither_size():
    cfg = tiny_config()
    w = dict(make_weights(cfg))
    w["linear_attn.norm.weight"] = np.ones(5, dtype=np.float32)
    with pytest.raises(E.NormWeightSizeError, match=r"5 elements, expected 3 \(shared.*or 12 \(per_head"):
        Layer(cfg, w, layer_index=0)


def test_missing_weight_is_named():
    cfg = tiny_config()
    w = dict(make_weights(cfg))
    del w["linear_attn.dt_bias"]
    with pytest.raises(E.MissingWeightError, match="missing 1: linear_attn.dt_bias") as info:
        Layer(cfg, w, layer_index=2)
    assert info.value.name == "linear_attn.dt_bias" and info.value.layer == 2


# --- snapshots (tests/core/test_safetensors_snapshot.py, test_untrusted_inputs.py) -------------------------
def _state():
    cfg = tiny_config()
    layer = Layer(cfg, make_weights(cfg))
    state = layer.new_state(2)
    layer.forward(make_inputs(cfg, 2, 5, seed=1), state, 0)
    return cfg, layer, state


def test_snapshot_save_load_round_trip(tmp_path):
    cfg, layer, state = _state()
    snap = state.snapshot()
    snap.save(tmp_path / "s.safetensors")
    loaded = Snapshot.load(tmp_path / "s.safetensors")
    np.testing.assert_array_equal(loaded.recurrent_state, state.recurrent_state)
    np.testing.assert_array_equal(loaded.conv_state, state.conv_state)
    assert loaded.seq_len.tolist() == [5, 5] and loaded.fingerprint == cfg.state_fingerprint()
    fresh = layer.new_state(2)
    fresh.restore(loaded)
    x = make_inputs(cfg, 2, 3, seed=9)
    a, _ = layer.forward(x, fresh, 5)
    b, _ = layer.forward(x, state, 5)
    np.testing.assert_array_equal(a, b)


def test_snapshot_file_schema_and_damage_refused(tmp_path):
    _cfg, _layer, state = _state()
    path = tmp_path / "s.safetensors"
    state.snapshot().save(path)
    f = SafetensorsFile(path)
    tensors = {k: f.read(k) for k in f}
    meta = dict(f.metadata)
    write_safetensors(tmp_path / "v2.safetensors", tensors, {**meta, "schema_version": "2"})
    with pytest.raises(E.SnapshotSchemaError, match="expected snapshot schema version 1, found '2'"):
        Snapshot.load(tmp_path / "v2.safetensors")
    tensors["recurrent_state"] = tensors["recurrent_state"] + 1e-3
    write_safetensors(tmp_path / "bad.safetensors", tensors, meta)
    with pytest.raises(E.SnapshotCorruptError, match="sha256"):
        Snapshot.load(tmp_path / "bad.safetensors")
    (tmp_path / "trunc.safetensors").write_bytes(path.read_bytes()[:-16])
    with pytest.raises(E.SnapshotCorruptError, match="damaged"):
        Snapshot.load(tmp_path / "trunc.safetensors")
    write_safetensors(tmp_path / "other.safetensors", {"x": np.ones(2)})
    with pytest.raises(E.SnapshotSchemaError, match="gdncheck-snapshot"):
        Snapshot.load(tmp_path / "other.safetensors")


def test_a_snapshot_of_other_dimensions_never_reaches_the_layer(tmp_path):
    """The measured failure: a restored snapshot of other dimensions failed in NumPy at the next forward."""
    from gdncheck.reference import Layer
    from gdncheck.synthetic import make_weights

    cfg = GDNConfig.from_hf(BASE)
    layer = Layer(cfg, make_weights(cfg, 0))
    state = layer.new_state(2)
    path = _snapshot(tmp_path, recurrent_state=np.zeros((2, 2, 4, 8), np.float32),
                     conv_state=np.zeros((2, 2 * 4 + 2 * 8, 4))).save(tmp_path / "s.safetensors")
    _resave(path, {}, {"fingerprint": cfg.state_fingerprint()})
    with pytest.raises(E.SnapshotError):
        state.restore(Snapshot.load(path))
