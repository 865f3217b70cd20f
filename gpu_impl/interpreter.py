"""What compiled code does that Triton's interpreter does not, emulated for our interpreted launches.

While one of our launches runs interpreted (`interpreting`): bfloat16 casts round to nearest even
(always on); with `emulate_gpu`, tf32 and tf32x3 dots truncate and split their operands as sm_90's
wgmma does, and programs run in reversed or shuffled order (the gpu_impl tests run with both on).
Races between the threads of one program are not emulated: kernels guard in-place updates with
`tl.debug_barrier`.

What each emulation reproduces and why: docs/gpu.md §1.
"""

from __future__ import annotations

import contextlib
import inspect
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import triton.language as tl
from triton.language import core as tl_core

ORDERS = ("grid", "reverse", "shuffle")


@dataclass
class Emulation:
    """What :func:`interpreting` emulates besides the bf16 cast (which is always on)."""

    tf32: bool = False
    order: str = "grid"
    seed: int = 0
    launches: int = 0  # interpreted launches so far (varies the shuffle from launch to launch)


_EMULATION = Emulation()


@contextlib.contextmanager
def emulate_gpu(*, tf32: bool = True, order: str = "shuffle", seed: int | str = 0) -> Iterator[Emulation]:
    """Interpreted launches inside this block emulate tf32 dots and run programs in ``order``
    (``grid`` | ``reverse`` | ``shuffle``; a shuffle is seeded by ``seed`` and the launch count)."""
    global _EMULATION
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, found {order!r}")
    if isinstance(seed, str):
        seed = zlib.crc32(seed.encode())
    previous, _EMULATION = _EMULATION, Emulation(tf32=tf32, order=order, seed=int(seed))
    try:
        yield _EMULATION
    finally:
        _EMULATION = previous


# --- bit-level helpers (NumPy, float32) -------------------------------------------------------------


def bf16_bits_rne(f32) -> np.ndarray:
    """bfloat16 bits of float32 values, rounded to nearest even as CUDA and torch round; NaN stays
    a quiet NaN."""
    u = np.ascontiguousarray(f32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


def tf32_truncate(x: np.ndarray) -> np.ndarray:
    """float32 with the low 13 mantissa bits cleared: what a tf32 tensor-core operand keeps."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return (u & np.uint32(0xFFFFE000)).view(np.float32)


def tf32_round(x: np.ndarray) -> np.ndarray:
    """``cvt.rna.tf32.f32``: to 10 mantissa bits, nearest, ties away from zero (finite inputs)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def dot_as_compiled(a: np.ndarray, b: np.ndarray, acc: np.ndarray, precision: str) -> np.ndarray:
    """``acc + a @ b`` for fp32 operands as sm_90 computes it at ``precision`` (tf32, tf32x3, ieee)."""
    if precision == "tf32":
        return np.matmul(tf32_truncate(a), tf32_truncate(b), dtype=np.float32) + acc
    if precision == "tf32x3":
        big_a, big_b = tf32_round(a), tf32_round(b)
        small_a, small_b = tf32_truncate(a - big_a), tf32_truncate(b - big_b)
        low = np.matmul(small_a, big_b, dtype=np.float32)
        low = np.matmul(big_a, small_b, dtype=np.float32) + low
        return np.matmul(big_a, big_b, dtype=np.float32) + (low + acc)
    return np.matmul(a, b, dtype=np.float32) + acc


def _precision_name(input_precision) -> str:
    """Triton's ``ir.INPUT_PRECISION`` member (or a string) -> ``tf32`` | ``tf32x3`` | ``ieee`` | ..."""
    name = getattr(input_precision, "name", None) or str(input_precision).rsplit(".", 1)[-1]
    return name.lower()


# --- patches of the interpreter, for the duration of one of our launches -----------------------------


def _cast_rne(cast_impl):
    from triton.runtime.interpreter import TensorHandle

    def cast(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return TensorHandle(bf16_bits_rne(src.data), dst_type.scalar)
        return cast_impl(self, src, dst_type)

    return cast


def _dot_tf32(create_dot):
    from triton.runtime.interpreter import TensorHandle

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.float32 and b.dtype.scalar == tl.float32 and d.dtype.scalar == tl.float32:
            out = dot_as_compiled(a.data, b.data, d.data, _precision_name(input_precision))
            return TensorHandle(out.astype(np.float32), d.dtype.scalar)
        return create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    return dot


def _program_order(set_grid_dim, set_grid_idx, emulation: Emulation):
    """set_grid_dim / set_grid_idx that hand out the grid's programs in a permuted order: the
    interpreter still asks for (0,0,0), (0,0,1), ...; the n-th request gets the n-th program of
    the permutation."""
    state = {}

    def grid_dim(self, nx, ny, nz):
        set_grid_dim(self, nx, ny, nz)
        n = nx * ny * nz
        if emulation.order == "reverse":
            perm = np.arange(n)[::-1]
        else:
            perm = np.random.default_rng((emulation.seed, emulation.launches)).permutation(n)
        state.update(perm=perm, dims=(nx, ny, nz))

    def grid_idx(self, x, y, z):
        _, ny, nz = state["dims"]
        p = int(state["perm"][(x * ny + y) * nz + z])
        set_grid_idx(self, p // (ny * nz), (p // nz) % ny, p % nz)

    return grid_dim, grid_idx


# --- the launch itself: what Triton's GridExecutor does, less what it re-derives every launch ---------
#
# Measured here (2026-12-07, Triton 3.9): a launch of a one-op kernel cost 1.8 ms, of which
# ``inspect.getmembers`` over tl, tl.core, tl.math and the tensor class (twice: once for this module's
# patch scope, once in GridExecutor) took about half; the interpreter's ``_get_np_dtype`` builds an
# 18-entry dict on each of its ~5 calls per operation. Neither result can change while a process
# runs, so both are computed once; every operation still goes through the interpreter's semantics.

_BUILTINS: dict[int, list] = {}  # id(pkg) -> [(name, member)] of its Triton builtins, unpatched


def _patch_builtin_cached(pkg, builder, scope) -> None:
    """The interpreter's ``_patch_builtin`` with ``inspect.getmembers`` done once per package: patch
    each builtin still in place (as the original does: a member patched already is no builtin)."""
    from triton.runtime import interpreter as ti

    found = _BUILTINS.get(id(pkg))
    if found is None:
        found = _BUILTINS[id(pkg)] = [(n, m) for n, m in inspect.getmembers(pkg) if tl_core.is_builtin(m)]
    for name, member in found:
        if getattr(pkg, name, None) is member:
            lean = _lean_builtin(member, ti.interpreter_semantic) if FAST_SEMANTICS else None
            if lean is None:
                ti._patch_attr(pkg, name, member, builder, scope)
            else:
                scope.set_attr(pkg, name, lean)


_LEAN: dict[int, object] = {}  # id(builtin) -> its patch (the builtins are kept alive by _BUILTINS)


def _lean_builtin(member, sem):
    """A builtin as the interpreter patches it — called with ``_semantic`` the interpreter's, whatever the
    caller passed — made once, calling the function under the ``builtin`` decorator directly: the
    interpreter's patch filters the keywords and calls the decorator's wrapper, which checks that
    ``_semantic`` was given and calls that function (about 3 µs of every operation). None where the builtin
    has no such function (then the interpreter's own patch)."""
    key = id(member)
    lean = _LEAN.get(key)
    if lean is None:
        fn = getattr(member, "__wrapped__", None)
        if fn is None or not callable(fn):
            return None

        def lean(*args, **kwargs):
            kwargs["_semantic"] = sem
            return fn(*args, **kwargs)

        lean.__name__ = getattr(member, "__name__", "builtin")
        _LEAN[key] = lean
    return lean


def _np_dtype_cached(get_np_dtype):
    """The interpreter's ``_get_np_dtype`` (a Triton dtype, block or scalar, to NumPy's), memoised by
    the scalar type (a block's NumPy dtype is its element's, pointers included)."""
    cache: dict = {}

    def get(tt_dtype):
        key = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(key, tl.pointer_type):  # unhashable; the original's first test
            return get_np_dtype(key)
        found = cache.get(key)
        if found is None:
            found = cache[key] = get_np_dtype(key)
        return found

    return get


@dataclass(frozen=True)
class _Signature:
    params: object  # inspect.Signature of the kernel function
    names: frozenset  # its parameter names
    constexprs: frozenset  # those annotated tl.constexpr


_SIGNATURES: dict = {}


def _signature(fn) -> _Signature:
    sig = _SIGNATURES.get(fn)
    if sig is None:
        from triton.runtime.jit import _normalize_ty

        params = inspect.signature(fn)
        notes = {name: _normalize_ty(ty) for name, ty in inspect.get_annotations(fn).items()}
        sig = _SIGNATURES[fn] = _Signature(params, frozenset(params.parameters),
                                           frozenset(n for n in params.parameters if notes.get(n) == "constexpr"))
    return sig


def run_grid(interpreted, grid: tuple[int, ...], kwargs: dict) -> None:
    """One interpreted launch of ``interpreted`` (Triton's ``InterpretedFunction``) over ``grid``, as
    its ``GridExecutor`` runs it, inside :func:`interpreting` (whose patch of ``tl`` serves it).

    Arguments are bound as ``inspect.getcallargs`` binds them (defaults filled), tensors and ints
    converted by the interpreter's ``_implicit_cvt``, and every program runs the interpreter's
    rewritten kernel in grid order (the builder's ``set_grid_idx``: :func:`emulate_gpu`'s order
    applies). What is left out is the copy of each CPU tensor's storage to a CPU storage and back
    (the same memory here) and the second patch of ``tl``. A launch with a tensor that is not on
    the CPU, or with pre-run hooks, goes through ``GridExecutor`` unchanged.
    """
    import torch
    import triton
    from triton.runtime import interpreter as ti

    fn = interpreted.fn
    cpu = all(v.device.type == "cpu" for v in kwargs.values() if isinstance(v, torch.Tensor))
    if not cpu or interpreted.pre_run_hooks or any(isinstance(v, triton.runtime.jit.TensorWrapper)
                                                   for v in kwargs.values()):
        interpreted[grid](**kwargs)
        return
    sig = _signature(fn)
    bound = sig.params.bind(**{k: v for k, v in kwargs.items() if k in sig.names})
    bound.apply_defaults()
    args = {name: arg if name in sig.constexprs else ti._implicit_cvt(arg) for name, arg in bound.arguments.items()}
    kernel_fn = interpreted.rewrite()
    grid = tuple(grid) + (1,) * (3 - len(grid))
    builder = ti.interpreter_builder
    builder.set_grid_dim(*grid)
    try:
        for x in range(grid[0]):
            for y in range(grid[1]):
                for z in range(grid[2]):
                    builder.set_grid_idx(x, y, z)
                    kernel_fn(**args)
    except Exception as e:
        if triton.knobs.compilation.front_end_debugging:
            raise
        raise ti.InterpreterError(repr(e)) from e


# --- the semantics of the commonest operations, without re-deriving what cannot change --------------
#
# Measured here (2026-12-07, Triton 3.9, the gate's 101 f32 cases): ~27% of the kernels' interpreted
# time went to the integer overflow check Triton's interpreter builds on every int32 add, sub and mul
# (``sanitize_overflow``: both operands cast to int64, the op redone, two compares, an and) only to
# hand it to ``device_assert``, which drops it unless the interpreter's ``debug`` option is on (it is
# off: ``InterpreterOptions``), and ~35% to type checks and broadcasts of operands that already have
# one type and one shape (Triton 3.9 broadcasts such operands anyway). Three methods of the
# interpreter's semantic object are wrapped while one of our launches runs; each does the common
# case directly, with the same result, and hands every other case to Triton's own method:
#
# - ``binary_op_type_checking_impl``: two tensors of one non-pointer type whose computation type is
#   that type (Triton's own ``computation_type_impl`` decides, once per dtype) come back unchanged;
# - ``broadcast_impl_value``: two blocks of one shape, or two scalars, come back unchanged (Triton's
#   would return broadcast views of the same values);
# - ``binary_op_sanitize_overflow_impl``: nothing built where ``debug`` is off (the check would be
#   dropped); with ``debug`` on, Triton's own (its assert fires on an overflow, as before).
#
# tests/gpu_impl/test_interpreter_semantics.py holds them equal to Triton's methods, result by result.


_NUMBERS = (int, float)  # Python numbers a kernel combines with a tensor (bool and constexpr: Triton's path)
_PLAIN = ("fp32", "fp64", "int32", "int64")  # element types whose constants are made exactly as NumPy makes them


def _shape_of(ty):
    """A block type's shape as a plain tuple of ints; None for a scalar type."""
    return tuple(ty.shape.values) if ty.is_block() else None


class _FastSemantics:
    """The wrapped methods of one semantic object (see above); ``install`` / ``remove`` put them on the
    instance and take them off."""

    NAMES = ("binary_op_type_checking_impl", "broadcast_impl_value", "binary_op_sanitize_overflow_impl")
    def __init__(self, sem):
        self.sem = sem
        cls = type(sem)
        self.orig = {name: getattr(cls, name).__get__(sem) for name in self.NAMES}
        self.same: dict = {}  # (a, a is a Python number, b, b is one, div_or_mod) -> computation type

    def _computes_in(self, a, a_scalar: bool, b, b_scalar: bool, div_or_mod: bool):
        key = (a.name, a_scalar, b.name, b_scalar, div_or_mod)
        found = self.same.get(key)
        if found is None:
            found = self.same[key] = self.sem.computation_type_impl(a, a_scalar, b, b_scalar, div_or_mod)
        return found

    def _splat_like(self, block, value):
        """``value`` (a scalar tensor of ``block``'s element type) splatted to ``block``'s type."""
        return self.sem.tensor(self.sem.builder.create_splat(block.type, value.handle), block.type)

    def binary_op_type_checking_impl(self, lhs, rhs, allow_lhs_ptr=False, allow_rhs_ptr=False,
                                     arithmetic_check=True, div_or_mod=False):
        sem, tensor = self.sem, self.sem.tensor
        lhs_t, rhs_t = type(lhs) is tensor, type(rhs) is tensor
        if lhs_t and rhs_t:
            lt, rt = lhs.type, rhs.type
            ls_, rs_ = lt.scalar, rt.scalar
            if not ls_.is_ptr() and not rs_.is_ptr():
                keeps = not arithmetic_check or self._computes_in(ls_, False, ls_, False, div_or_mod) == ls_
                if ls_ == rs_ and keeps:
                    ls, rs = _shape_of(lt), _shape_of(rt)
                    if ls == rs:  # one type, one shape
                        return lhs, rhs
                    if rs is None:  # a block and a scalar of its element type: the scalar splatted
                        return lhs, self._splat_like(lhs, rhs)
                    if ls is None:
                        return self._splat_like(rhs, lhs), rhs
                    return self.broadcast_impl_value(lhs, rhs)
                if arithmetic_check:  # two types: both cast to the computation type, as Triton does
                    ret = self._computes_in(ls_, False, rs_, False, div_or_mod)
                    return self.broadcast_impl_value(sem.cast(lhs, ret), sem.cast(rhs, ret))
            else:  # a pointer: Triton's own checks, then the operands as they are
                sem.check_ptr_type_impl(ls_, rs_, allow_lhs_ptr)
                sem.check_ptr_type_impl(rs_, ls_, allow_rhs_ptr)
                return self.broadcast_impl_value(lhs, rhs)
        elif (lhs_t and type(rhs) is int and lhs.type.scalar.is_ptr()
              or rhs_t and type(lhs) is int and rhs.type.scalar.is_ptr()):  # a pointer and an int offset
            block, number = (lhs, rhs) if lhs_t else (rhs, lhs)
            num_ty = sem.to_tensor_type(number)
            sem.check_ptr_type_impl(block.type.scalar, num_ty, allow_lhs_ptr if lhs_t else allow_rhs_ptr)
            sem.check_ptr_type_impl(num_ty, block.type.scalar, allow_rhs_ptr if lhs_t else allow_lhs_ptr)
            const = sem.to_tensor(number)
            return self.broadcast_impl_value(lhs, const) if lhs_t else self.broadcast_impl_value(const, rhs)
        elif arithmetic_check and (lhs_t and type(rhs) in _NUMBERS or rhs_t and type(lhs) in _NUMBERS):
            block, number = (lhs, rhs) if lhs_t else (rhs, lhs)
            sca = block.type.scalar
            if sca.name in _PLAIN:
                num_ty = sem.to_tensor_type(number)
                if ((self._computes_in(sca, False, num_ty, True, div_or_mod) if lhs_t
                     else self._computes_in(num_ty, True, sca, False, div_or_mod)) == sca):
                    # Triton's own range checks and constant, splatted to a block's own type
                    const = sem._cast_to_computation_type(number, sca)
                    if block.type.is_block():
                        const = self._splat_like(block, const)
                    return (block, const) if lhs_t else (const, block)
        return self.orig["binary_op_type_checking_impl"](lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check,
                                                         div_or_mod)

    def broadcast_impl_value(self, lhs, rhs):
        lt, rt = lhs.type, rhs.type
        ls, rs = _shape_of(lt), _shape_of(rt)
        if ls == rs:
            return lhs, rhs
        if ls is not None and rs is not None and len(ls) == len(rs):
            try:
                shape = np.broadcast_shapes(ls, rs)
            except ValueError:
                shape = None  # Triton's own error
            if shape is not None:
                return self._broadcast(lhs, ls, shape), self._broadcast(rhs, rs, shape)
        return self.orig["broadcast_impl_value"](lhs, rhs)

    def _broadcast(self, x, shape, to):
        if shape == to:
            return x
        ty = tl.block_type(x.type.scalar, list(to))
        return self.sem.tensor(self.sem.builder.create_broadcast(x.handle, list(to)), ty)

    def binary_op_sanitize_overflow_impl(self, lhs, rhs, binary_op):
        if not self.sem.builder.options.debug:
            return None  # Triton's would compute the check and hand it to device_assert, which drops it
        return self.orig["binary_op_sanitize_overflow_impl"](lhs, rhs, binary_op)

    def install(self) -> None:
        for name in self.NAMES:
            setattr(self.sem, name, getattr(self, name))

    def remove(self) -> None:
        for name in self.NAMES:
            self.sem.__dict__.pop(name, None)


#: whether :func:`interpreting` installs :class:`_FastSemantics` and :class:`_TypeCache` (tests turn it off to
#: compare with Triton's own semantics, bit for bit)
FAST_SEMANTICS = True
_FAST: _FastSemantics | None = None


class _TypeCache:
    """``tl.block_type.__init__`` and ``tl.tensor.__init__`` with what they derive from a shape made
    once per shape: Triton 3.9 builds, for every block type and every tensor, a Triton tuple of the
    shape (with a tuple type of one constexpr type per dimension), checks it and counts its elements
    — about a quarter of an operation's cost. The attributes come out as Triton's own ``__init__``
    makes them (the first object of each shape is made by it, and later ones share its parts: these
    values are never mutated)."""

    def __init__(self):
        self.block_init = tl.block_type.__init__
        self.tensor_init = tl_core.tensor.__init__
        self.blocks: dict = {}  # shape ints -> (shape tuple, numel, str(shape))
        self.tensors: dict = {}  # shape ints -> (shape tuple of constexprs, numel constexpr)

    def block_type_init(self, bt, element_ty, shape):
        dims = shape.values if type(shape) is tl_core.tuple else shape
        key = tuple(dims) if type(dims) in (list, tuple) and dims and all(type(d) is int for d in dims) else None
        found = self.blocks.get(key) if key is not None else None
        if found is None:
            self.block_init(bt, element_ty, shape)
            if key is not None:
                self.blocks[key] = (bt.shape, bt.numel, str(bt.shape))
            return
        bt.element_ty = element_ty
        bt.shape, bt.numel, text = found
        bt.name = f"<{text}, {element_ty}>"

    def tensor_init_fast(self, t, handle, type):
        key = tuple(type.shape.values) if type.is_block() else ()
        found = self.tensors.get(key)
        if found is None:
            self.tensor_init(t, handle, type)
            self.tensors[key] = (t.shape, t.numel)
            return
        t.handle = handle
        t.type = type
        t.dtype = type.scalar
        t.shape, t.numel = found

    def install(self) -> None:
        cache = self
        tl.block_type.__init__ = lambda bt, element_ty, shape: cache.block_type_init(bt, element_ty, shape)
        tl_core.tensor.__init__ = lambda t, handle, type: cache.tensor_init_fast(t, handle, type)

    def remove(self) -> None:
        tl.block_type.__init__ = self.block_init
        tl_core.tensor.__init__ = self.tensor_init


_TYPES: _TypeCache | None = None


def _install_fast(sem) -> tuple[_FastSemantics, _TypeCache]:
    global _FAST, _TYPES
    if _FAST is None or _FAST.sem is not sem:
        _FAST = _FastSemantics(sem)
    if _TYPES is None:
        _TYPES = _TypeCache()
    _FAST.install()
    _TYPES.install()
    return _FAST, _TYPES


_DEPTH = 0
_NP_DTYPE = None  # the memoised _get_np_dtype, made on the first launch


def _lang_anchor():  # its module globals hold ``tl`` and ``tl.core``, which _patch_lang patches
    return tl, tl_core


@contextlib.contextmanager
def interpreting() -> Iterator[None]:
    """Patch ``tl`` and ``tl.core`` once for the whole launch (so nested library calls need not)
    and the interpreter's builder for the emulation above; undo it all afterwards."""
    global _DEPTH
    from triton.runtime import interpreter as ti
    from triton.runtime.interpreter import InterpreterBuilder, _patch_lang

    helpers = {"_patch_builtin": ti._patch_builtin, "_get_np_dtype": ti._get_np_dtype}
    if not _DEPTH:
        ti._patch_builtin = _patch_builtin_cached
    scope = _patch_lang(_lang_anchor)
    saved = {name: getattr(InterpreterBuilder, name)
             for name in ("cast_impl", "create_dot", "set_grid_dim", "set_grid_idx")}
    emulation = _EMULATION
    fast = None
    if not _DEPTH:
        global _NP_DTYPE
        if _NP_DTYPE is None:
            _NP_DTYPE = _np_dtype_cached(helpers["_get_np_dtype"])
        ti._get_np_dtype = _NP_DTYPE
        InterpreterBuilder.cast_impl = _cast_rne(saved["cast_impl"])
        if emulation.tf32:
            InterpreterBuilder.create_dot = _dot_tf32(saved["create_dot"])
        if emulation.order != "grid":
            InterpreterBuilder.set_grid_dim, InterpreterBuilder.set_grid_idx = _program_order(
                saved["set_grid_dim"], saved["set_grid_idx"], emulation)
        emulation.launches += 1
        fast = _install_fast(ti.interpreter_semantic) if FAST_SEMANTICS else None
    _DEPTH += 1
    try:
        with np.errstate(over="ignore", divide="ignore", invalid="ignore", under="ignore"):
            yield  # IEEE semantics as on a GPU: inf and NaN without NumPy's warnings
    finally:
        _DEPTH -= 1
        if not _DEPTH:
            for name, fn in saved.items():
                setattr(InterpreterBuilder, name, fn)
            if fast is not None:
                fast[0].remove()
                fast[1].remove()
        scope.restore()
        if not _DEPTH:
            for name, fn in helpers.items():
                setattr(ti, name, fn)
