"""The interpreter's semantics made cheaper (gpu_impl/interpreter.py ``_FastSemantics``, ``_TypeCache``):
each wrapped method gives what Triton's own gives, type and values, on the operand kinds the kernels
make and on those it hands back to Triton; the overflow check as Triton's (dropped unless ``debug``); and
whole layer calls
come out bit for bit as under Triton's own semantics."""

from __future__ import annotations

import numpy as np
import pytest
import triton.language as tl
from triton.runtime import interpreter as ti
from triton.runtime.interpreter import TensorHandle

from gdncheck.gpu_impl import interpreter
from tests.gpu_impl.helpers import needs_interpreter

SEM = ti.interpreter_semantic


def _t(values, dtype, shape=None):
    """A Triton tensor as the interpreter holds one: NumPy data, a block type (a scalar type without a shape)."""
    np_dtype = {tl.float32: np.float32, tl.float64: np.float64, tl.int32: np.int32, tl.int64: np.int64,
                tl.float16: np.float16, tl.int1: np.bool_}[dtype]
    data = np.asarray(values, dtype=np_dtype)
    ty = tl.block_type(dtype, list(data.shape)) if shape is None and data.ndim else dtype
    if not data.ndim:
        data = data.reshape(1)
    return SEM.tensor(TensorHandle(data, dtype), ty)


def _ptr(n):
    """A block of n float32 pointers (addresses 4 apart)."""
    ty = tl.pointer_type(tl.float32)
    return SEM.tensor(TensorHandle(np.arange(n, dtype=np.uint64) * 4 + 4096, ty), tl.block_type(ty, [n]))


def _same(a, b):
    """The results of two calls are the same: types equal (as Triton compares them) and data equal bit for bit."""
    if isinstance(a, tuple):
        assert len(a) == len(b)
        return all(_same(x, y) for x, y in zip(a, b))
    assert str(a.type) == str(b.type) and a.type == b.type
    x, y = np.asarray(a.handle.data), np.asarray(b.handle.data)
    assert x.dtype == y.dtype and x.shape == y.shape
    assert np.ascontiguousarray(x).tobytes() == np.ascontiguousarray(y).tobytes()
    return True


R = np.random.default_rng(7)
F4 = R.standard_normal(4).astype(np.float32)
F41 = R.standard_normal((4, 1)).astype(np.float32)
F18 = R.standard_normal((1, 8)).astype(np.float32)
I4 = np.array([3, -7, 2**30, 11], dtype=np.int32)

OPERANDS = {  # (lhs, rhs) pairs of the kinds the kernels make, and some Triton handles itself
    "same block": lambda: (_t(F4, tl.float32), _t(F4[::-1], tl.float32)),
    "block, scalar tensor": lambda: (_t(F4, tl.float32), _t(2.5, tl.float32)),
    "scalar tensor, block": lambda: (_t(I4[0], tl.int32), _t(I4, tl.int32)),
    "block, int": lambda: (_t(I4, tl.int32), 5),
    "int, block": lambda: (3, _t(I4, tl.int32)),
    "block, float": lambda: (_t(F4, tl.float32), 0.1),
    "int block, float": lambda: (_t(I4, tl.int32), 0.5),
    "int64 block, int": lambda: (_t(I4.astype(np.int64), tl.int64), 2**40),
    "block, large int": lambda: (_t(I4, tl.int32), 2**40),
    "scalar tensor, int": lambda: (_t(7, tl.int32), 9),
    "int32 block, int64 block": lambda: (_t(I4, tl.int32), _t(I4.astype(np.int64) * 3, tl.int64)),
    "column, row": lambda: (_t(F41, tl.float32), _t(F18, tl.float32)),
    "bool column, row": lambda: (_t(F41 > 0, tl.int1), _t(F18 > 0, tl.int1)),
    "int64 scalar, int32 column": lambda: (_t(2**33, tl.int64), _t(I4.reshape(4, 1), tl.int32)),
    "int32 scalar, float": lambda: (_t(7, tl.int32), 0.25),
    "fp16 blocks": lambda: (_t(F4.astype(np.float16), tl.float16), _t(F4.astype(np.float16), tl.float16)),
    "fp16 block, float": lambda: (_t(F4.astype(np.float16), tl.float16), 1.5),
    "pointers, offsets": lambda: (_ptr(4), _t(I4 % 8, tl.int32)),
    "pointers, int": lambda: (_ptr(4), 3),
    "bool blocks": lambda: (_t([True, False, True, True], tl.int1), _t([False, False, True, True], tl.int1)),
}


def _both(method: str, make, *extra):
    """(the wrapped method's result, Triton's own method's result) on fresh operands ``make()`` and ``extra``; an
    exception is a result."""
    fast = interpreter._FastSemantics(SEM)
    out = []
    for fn in (getattr(fast, method), fast.orig[method]):
        try:
            out.append(fn(*make(), *extra))
        except Exception as exc:  # noqa: BLE001 - the exception is what is compared
            out.append(exc)
    return out


@needs_interpreter
@pytest.mark.parametrize("kind", sorted(OPERANDS))
@pytest.mark.parametrize("flags", [(False, False, True, False), (True, True, True, False), (False, False, True, True),
                                   (False, False, False, False)], ids=["arith", "ptr", "div", "bitwise"])
def test_binary_op_type_checking_is_tritons(kind, flags):
    mine, theirs = _both("binary_op_type_checking_impl", OPERANDS[kind], *flags)
    if kind in ("same block", "column, row", "block, int") or kind.startswith("pointers") and flags[0]:
        assert not isinstance(theirs, Exception), theirs  # the kinds the kernels make are operands Triton takes
    if isinstance(theirs, Exception):
        assert type(mine) is type(theirs) and str(mine) == str(theirs)
    else:
        assert not isinstance(mine, Exception), mine
        _same(mine, theirs)


@needs_interpreter
@pytest.mark.parametrize("kind", ["same block", "block, scalar tensor", "scalar tensor, block", "column, row",
                                  "fp16 blocks", "bool blocks"])
def test_broadcast_is_tritons(kind):
    mine, theirs = _both("broadcast_impl_value", OPERANDS[kind])
    _same(mine, theirs)


def test_broadcast_refuses_what_triton_refuses():
    mine, theirs = _both("broadcast_impl_value", lambda: (_t(F4, tl.float32), _t(np.zeros(8, np.float32), tl.float32)))
    assert isinstance(theirs, ValueError) and type(mine) is type(theirs) and str(mine) == str(theirs)


@needs_interpreter
@pytest.mark.parametrize("debug", [False, True], ids=["debug off", "debug on"])
@pytest.mark.parametrize("op", ["add", "sub", "mul"])
@pytest.mark.parametrize("values", [(I4, np.array([1, 2, -3, 4], np.int32)),
                                    (I4, np.array([0, 0, 2**30, 0], np.int32))], ids=["in range", "overflows"])
def test_overflow_check_is_tritons(op, values, debug, monkeypatch):
    """Triton's interpreter drops the check unless its ``debug`` option is on (then its assert fires on an
    overflow): the wrapped method does the same."""
    import dataclasses

    monkeypatch.setattr(SEM.builder, "options", dataclasses.replace(SEM.builder.options, debug=debug))
    a, b = values
    mine, theirs = _both("binary_op_sanitize_overflow_impl",
                         lambda: (_t(a, tl.int32), _t(b, tl.int32), getattr(SEM, op)))
    wide = {"add": np.add, "sub": np.subtract, "mul": np.multiply}[op](a.astype(np.int64), b.astype(np.int64))
    overflows = bool((wide > 2**31 - 1).any() or (wide < -2**31).any())
    if debug and overflows:
        assert isinstance(theirs, Exception) and type(mine) is type(theirs) and str(mine) == str(theirs)
        assert "overflow" in str(theirs)
    else:
        assert mine is None and theirs is None


@needs_interpreter
def test_types_made_from_the_cache_are_tritons():
    cache = interpreter._TypeCache()
    for shape in ([4], [4, 1], [1, 8], [2, 4, 8], [4]):
        for elem in (tl.float32, tl.int1, tl.pointer_type(tl.float16)):
            ours = tl.block_type.__new__(tl.block_type)
            cache.block_type_init(ours, elem, list(shape))
            theirs = tl.block_type(elem, shape)
            assert ours == theirs and ours.name == theirs.name and ours.numel == theirs.numel
            assert type(ours.shape) is type(theirs.shape) and list(ours.shape) == list(theirs.shape)
            t_ours = tl.tensor.__new__(tl.tensor)
            cache.tensor_init_fast(t_ours, None, theirs)
            t_theirs = tl.tensor(None, theirs)
            assert t_ours.type == t_theirs.type and t_ours.dtype == t_theirs.dtype
            assert [s.value for s in t_ours.shape] == [s.value for s in t_theirs.shape]
            assert t_ours.numel.value == t_theirs.numel.value
    with pytest.raises(TypeError, match="0d block_type"):
        cache.block_type_init(tl.block_type.__new__(tl.block_type), tl.float32, [])


def _layer_calls(profile: str) -> list[np.ndarray]:
    """A chunked prefill (70 tokens: past one 64-token chunk) and a decode of the Triton layer, with the stage
    trace: every output, stage and state as float32 arrays."""
    import gdncheck.gpu_impl as G
    from gdncheck.config import GDNConfig
    from gdncheck.synthetic import make_inputs, make_weights

    cfg = GDNConfig(hidden_size=32, intermediate_size=24, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8,
                    conv_kernel=4)
    layer = G.Layer(cfg, make_weights(cfg, seed=3), profile=profile, device="cpu")
    state = layer.new_state(2)
    out, pos = [], 0
    for T, seed in ((70, 4), (1, 5)):
        y, trace = layer.forward(make_inputs(cfg, 2, T, seed=seed), state, pos, capture=True)
        pos += T
        out += [y.float().numpy(), state.conv_state.float().numpy(), state.recurrent_state.numpy().copy()]
        out += [trace[k].float().numpy() for k in sorted(trace)]
    return out


@needs_interpreter
@pytest.mark.parametrize("profile", ["f32", "bf16"])
def test_layer_calls_are_bit_identical_to_tritons_semantics(profile, monkeypatch):
    fast = _layer_calls(profile)
    monkeypatch.setattr(interpreter, "FAST_SEMANTICS", False)
    slow = _layer_calls(profile)
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow):
        assert a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@needs_interpreter
def test_a_lean_builtin_is_called_as_the_interpreters_patch_calls_it():
    """The patched builtin calls the decorated function with the interpreter's semantic object, whatever
    ``_semantic`` the caller passed, and gives the interpreter's patch's result."""
    calls = []

    @tl.core.builtin
    def probe(x, y=1, _semantic=None):
        calls.append(_semantic)
        return x + y

    lean = interpreter._lean_builtin(probe, SEM)
    assert lean(2, y=3) == 5 and lean(2, _semantic="someone else's") == 3
    assert calls == [SEM, SEM]
    assert interpreter._lean_builtin(probe, SEM) is lean  # made once
    with pytest.raises(ValueError, match="_semantic"):  # the decorator's check: what the lean patch stands in for
        probe(2)
