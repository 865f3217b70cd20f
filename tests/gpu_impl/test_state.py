"""The device state: snapshots (bit-identical replay, no aliasing), the neutral snapshot file in
both directions with the reference, seq_pos resets and strict mode, input errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gdncheck.reference as R
from gdncheck.errors import (
    InputDtypeError,
    InputError,
    SnapshotCorruptError,
    SnapshotDimensionError,
)
from gdncheck.gpu_impl import DeviceSnapshot, Layer
from gdncheck.snapshot import Snapshot
from gdncheck.synthetic import make_inputs, make_weights
from tests.gpu_impl.compare import check
from tests.gpu_impl.helpers import DEVICE
from tests.helpers import tiny_config

CFG = tiny_config(Hk=2, Hv=4, dk=16, dv=8, D=32, I=48)
WEIGHTS = make_weights(CFG, seed=0)


def gpu_layer(profile="f32", **kw):
    return Layer(CFG, WEIGHTS, profile=profile, device=DEVICE, chunk_size=16, **kw)


@pytest.mark.parametrize("profile", ["f32", "bf16"])
def test_snapshot_restore_replay_is_bit_identical(profile):
    layer = gpu_layer(profile)
    x = make_inputs(CFG, 2, 40, seed=1)
    state = layer.new_state(2)
    layer.forward(x[:, :20], state, 0)
    snap = state.snapshot()
    first = [layer.forward(x[:, 20:21], state, 20)[0], layer.forward(x[:, 21:40], state, 21)[0]]
    after = state.snapshot()
    state.restore(snap)
    again = [layer.forward(x[:, 20:21], state, 20)[0], layer.forward(x[:, 21:40], state, 21)[0]]
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    for t in ("conv_state", "recurrent_state", "seq_len"):
        assert torch.equal(getattr(state, t), getattr(after, t)), t
    assert snap.seq_len.tolist() == [20, 20], "the snapshot was aliased to the live state"


def test_snapshot_is_a_deep_copy_both_ways():
    layer = gpu_layer()
    state = layer.new_state(1)
    layer.forward(make_inputs(CFG, 1, 5, seed=2), state, 0)
    snap = state.snapshot()
    before = snap.recurrent_state.clone()
    state.recurrent_state += 1.0
    assert torch.equal(snap.recurrent_state, before)
    state.restore(snap)
    snap.recurrent_state += 1.0
    assert torch.equal(state.recurrent_state, before)


@pytest.mark.parametrize("profile", ["f32", "bf16"])
def test_snapshot_files_both_ways_with_the_reference(profile, tmp_path):
    """Triton snapshot file -> reference state, and reference file -> Triton state: both continue
    the same sequence as the other implementation (within the layer bound)."""
    ref, layer = R.Layer(CFG, WEIGHTS), gpu_layer(profile)
    x = make_inputs(CFG, 2, 30, seed=3)
    ref_state, state = ref.new_state(2), layer.new_state(2)
    ref.forward(x[:, :20], ref_state, 0)
    layer.forward(x[:, :20], state, 0)

    path = state.snapshot().save(tmp_path / "triton.safetensors")
    ref_from_triton = ref.new_state(2)
    ref_from_triton.restore(Snapshot.load(path))
    assert ref_from_triton.seq_len.tolist() == [20, 20]
    want, _ = ref.forward(x[:, 20:], ref_from_triton, 20)
    got, _ = layer.forward(x[:, 20:], state, 20)
    check(got, want, "layer", profile, "Triton continuing vs reference restored from the Triton file")

    ref_path = ref_state.snapshot().save(tmp_path / "reference.safetensors")
    for snap in (DeviceSnapshot.load(ref_path), Snapshot.load(ref_path)):
        triton_from_ref = layer.new_state(2)
        triton_from_ref.restore(snap)
        got, _ = layer.forward(x[:, 20:], triton_from_ref, 20)
        want, _ = ref.forward(x[:, 20:], _copy(ref, ref_state), 20)
        check(got, want, "layer", profile, f"Triton restored from the reference file ({type(snap).__name__})")


def _copy(ref, ref_state):
    """An independent reference state equal to ``ref_state``."""
    s = ref.new_state(ref_state.batch)
    s.restore(ref_state.snapshot())
    return s


def test_own_file_round_trip_is_exact(tmp_path):
    layer = gpu_layer("bf16")
    state = layer.new_state(2)
    layer.forward(make_inputs(CFG, 2, 9, seed=4), state, 0)
    snap = state.snapshot()
    loaded = DeviceSnapshot.load(snap.save(tmp_path / "s.safetensors"))
    fresh = layer.new_state(2)
    fresh.restore(loaded)
    for t in ("conv_state", "recurrent_state", "seq_len"):
        assert torch.equal(getattr(fresh, t), getattr(state, t)), t


def test_foreign_snapshots_are_refused(tmp_path):
    other = tiny_config(Hk=2, Hv=2, dk=16, dv=8, D=32, I=48)
    foreign = Layer(other, make_weights(other), device=DEVICE).new_state(1).snapshot()
    state = gpu_layer().new_state(1)
    with pytest.raises(SnapshotDimensionError, match="fingerprint"):
        state.restore(foreign)
    with pytest.raises(SnapshotDimensionError, match="batch 1"):
        state.restore(gpu_layer().new_state(2).snapshot())
    path = state.snapshot().save(tmp_path / "s.safetensors")
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotCorruptError):
        DeviceSnapshot.load(path)


def test_torch_integer_input_is_refused():
    """The contract test (tests/test_call_contract.py) covers NumPy inputs; a torch tensor is this path's own."""
    layer = gpu_layer()
    with pytest.raises(InputDtypeError, match="floating dtype"):
        layer.forward(torch.zeros(1, 3, 32, dtype=torch.int64), layer.new_state(1), 0)


def test_constructor_argument_errors():
    layer = gpu_layer()
    with pytest.raises(InputError, match="gpu_impl State"):
        layer.forward(np.zeros((1, 1, 32)), R.Layer(CFG, WEIGHTS).new_state(1), 0)
    for kw in ({"profile": "fp8"}, {"delta_rule": "fast"}, {"chunk_size": 48}, {"device": "tpu"}):
        with pytest.raises(ValueError):
            Layer(CFG, WEIGHTS, **kw)
