"""The call contract (docs/spec.md §4, §5), once over every layer implementation in the repository.

The float64 reference, the Triton path (compiled on a GPU, Triton's interpreter here), the
precision-emulating layer in each profile and a mutant (the mutants inherit the emulated layer's
call handling; this one's bug is in the math only) all refuse the same inputs with the same error
codes, keep the seq_pos rule and leave a state untouched when strict mode refuses a call. Each of
them checks its inputs through ``gdncheck/calls.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from gdncheck.conformance.earn.emulate import EmulatedLayer
from gdncheck.conformance.meta.mutants import MUTANT_BY_NAME
from gdncheck.errors import InputDtypeError, InputError, InputShapeError, SeqPosMismatchError
from gdncheck.harness import to_numpy
from gdncheck.reference import Layer as ReferenceLayer
from gdncheck.synthetic import make_inputs, make_weights
from tests.helpers import tiny_config

CFG = tiny_config(Hk=2, Hv=4, dk=16, dv=8, D=32, I=48)
OTHER = tiny_config(Hk=1, Hv=2, dk=16, dv=8, D=32, I=48)  # same D, another state size
D = CFG.hidden_size


def _triton(cfg, weights, strict):
    from gdncheck.gpu_impl import Layer, resolve_device  # the triton extra

    return Layer(cfg, weights, profile="f32", device=resolve_device(), strict=strict, chunk_size=16)


def _emulated(profile: str):
    return lambda cfg, weights, strict: EmulatedLayer(cfg, weights, profile=profile, strict=strict)


LAYERS: dict[str, Callable] = {
    "reference": lambda cfg, weights, strict: ReferenceLayer(cfg, weights, strict=strict),
    "triton": _triton,
    "emulated-f32": _emulated("f32"),
    "emulated-bf16": _emulated("bf16"),
    "emulated-f16": _emulated("f16"),
    "mutant-head_grouping_tiled": lambda cfg, weights, strict: MUTANT_BY_NAME["head_grouping_tiled"].cls(
        cfg, weights, profile="bf16", strict=strict),
}


@pytest.fixture(params=list(LAYERS), scope="module")
def kind(request):
    return request.param


def make(kind: str, cfg=CFG, strict: bool = False):
    return LAYERS[kind](cfg, make_weights(cfg, seed=0), strict)


def state_arrays(state) -> dict[str, np.ndarray]:
    return {n: np.array(to_numpy(getattr(state, n)), copy=True) for n in ("conv_state", "recurrent_state", "seq_len")}


def x_of(batch: int, tokens: int, seed: int = 1) -> np.ndarray:
    return make_inputs(CFG, batch, tokens, seed=seed).astype(np.float32)


@pytest.mark.parametrize("shape", [(1, 3, D + 1), (3, D), (1, 1, 3, D), (2, 3, D), (1, 0, D)],
                         ids=["wrong-D", "rank-2", "rank-4", "wrong-batch", "T=0"])
def test_x_of_the_wrong_shape(kind, shape):
    layer = make(kind)
    with pytest.raises(InputShapeError, match=rf"expected x of shape \[B=1, T>=1, D={D}\], found "):
        layer.forward(np.zeros(shape, dtype=np.float32), layer.new_state(1), 0)


@pytest.mark.parametrize("dtype", [np.int32, np.complex64, np.bool_])
def test_x_of_the_wrong_dtype(kind, dtype):
    layer = make(kind)
    with pytest.raises(InputDtypeError, match="real floating dtype"):
        layer.forward(np.zeros((1, 3, D), dtype=dtype), layer.new_state(1), 0)


@pytest.mark.parametrize("seq_pos", [1.5, [0, 0, 0], [[0, 0]], np.array([0.0, 0.0]), "0"],
                         ids=["float", "wrong-length", "nested", "float-array", "string"])
def test_seq_pos_not_integers_one_per_sequence(kind, seq_pos):
    layer = make(kind)
    with pytest.raises(InputShapeError, match=r"expected seq_pos as an int or 2 ints \(one per sequence\)"):
        layer.forward(x_of(2, 1), layer.new_state(2), seq_pos)


@pytest.mark.parametrize("seq_pos", [-3, [0, -1]])
def test_negative_seq_pos(kind, seq_pos):
    layer = make(kind)
    state = layer.new_state(2)
    with pytest.raises(InputError, match=r"expected seq_pos >= 0, found") as err:
        layer.forward(x_of(2, 1), state, seq_pos)
    assert err.value.code == "input_error"
    assert state_arrays(state)["seq_len"].tolist() == [0, 0]


def test_a_list_for_one_sequence(kind):
    layer = make(kind)
    with pytest.raises(InputShapeError, match="one per sequence"):
        layer.forward(x_of(1, 1), layer.new_state(1), [0, 0])
    out, _ = layer.forward(x_of(1, 1), state := layer.new_state(1), [0])  # one int per sequence: fine
    assert to_numpy(out).shape == (1, 1, D) and state_arrays(state)["seq_len"].tolist() == [1]


def test_strict_mode_refuses_a_mismatch_and_changes_nothing(kind):
    layer = make(kind, strict=True)
    x = x_of(1, 5)
    state = layer.new_state(1)
    layer.forward(x[:, :3], state, 0)
    before = state_arrays(state)
    with pytest.raises(SeqPosMismatchError, match=r"expected seq_pos equal to the state's seq_len, found row 0: "
                                                  r"state seq_len=3, seq_pos=1") as err:
        layer.forward(x[:, 3:], state, 1)
    assert err.value.code == "seq_pos_mismatch"
    after = state_arrays(state)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    layer.forward(x[:, 3:], state, 3)  # the right position still runs
    assert state_arrays(state)["seq_len"].tolist() == [5]


def test_a_mismatched_row_is_reset_and_only_that_row(kind):
    layer = make(kind)
    x = x_of(2, 7, seed=2)
    state = layer.new_state(2)
    layer.forward(x[:, :4], state, 0)
    mixed, _ = layer.forward(x[:, 4:6], state, [4, 0])  # row 0 continues, row 1 restarts at 0
    assert state_arrays(state)["seq_len"].tolist() == [6, 2]
    cont_state = layer.new_state(2)
    layer.forward(x[:, :4], cont_state, 0)
    cont, _ = layer.forward(x[:, 4:6], cont_state, [4, 4])
    fresh, _ = layer.forward(x[:, 4:6], layer.new_state(2), [0, 0])
    mixed, cont, fresh = to_numpy(mixed), to_numpy(cont), to_numpy(fresh)
    np.testing.assert_array_equal(mixed[0], cont[0])  # the continuing row: as if nothing happened
    np.testing.assert_array_equal(mixed[1], fresh[1])  # the reset row: as from a zero state


def test_a_state_of_another_layer_kind_is_refused(kind):
    layer = make(kind)
    other = "emulated-f32" if kind == "reference" else "reference"
    with pytest.raises(InputError, match="State") as err:
        layer.forward(x_of(1, 1), make(other).new_state(1), 0)
    assert err.value.code == "input_error"


def test_a_state_of_other_dimensions_is_refused(kind):
    layer = make(kind)
    with pytest.raises(InputError, match=r"expected a state of this layer's dimensions") as err:
        layer.forward(x_of(1, 1), make(kind, OTHER).new_state(1), 0)
    assert err.value.code == "input_error"
