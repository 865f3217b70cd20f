"""Where the Triton path runs: the device, the kernel target, and the output allocation hook.

One code path, two targets. A kernel launched on CUDA tensors is compiled (``JITFunction``); the
same kernel launched on CPU tensors runs under Triton's interpreter (``InterpretedFunction``).
The target follows the tensors, so one process can run both.

When Triton reads ``TRITON_INTERPRET``
--------------------------------------
Triton reads the variable when a function is *decorated*: ``@triton.jit`` returns an
``InterpretedFunction`` if it is set and a ``JITFunction`` otherwise, and a launch never looks
at it again. Triton's own library functions (``tl.sum``, ``tl.max``, ``tl.cumsum``,
``tl.zeros``, ``tl.sigmoid``, ...) are decorated at ``import triton``. Setting the variable
after triton has been imported (by torch, a test plugin, or the user) therefore has no
effect on them, and an interpreted kernel that calls one of them fails with "Cannot call
@triton.jit'd outside of the scope of a kernel".

So this package does not depend on the variable or on import order:

- its kernels are decorated with :func:`kernel`, which keeps the Python function and builds
  both forms on demand. The tensors' device picks one at each launch;
- while an interpreted launch runs, calls into ``JITFunction`` objects (Triton's library,
  our helpers) run interpreted. This is a small shim over ``JITFunction.__call__``, which
  Triton otherwise makes raise; compiled launches never call it. It uses two internals of
  ``triton.runtime.interpreter``: ``InterpretedFunction`` and ``_patch_lang``.

``TRITON_INTERPRET=1`` set before triton was imported still works. Triton's library is then
interpreted-only, so CUDA cannot be used in that process: ``device="auto"`` resolves to the CPU
and ``device="cuda"`` is refused with an explanation.

Device choice: the ``device=`` argument, else ``GDN_DEVICE`` (``auto`` | ``cpu`` | ``cuda``),
else ``auto``. ``auto`` means CUDA when torch sees a GPU and the interpreter was not forced.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch
import triton
import triton.language as tl
from triton.language import core as tl_core
from triton.runtime.jit import JITFunction

DEVICES = ("auto", "cpu", "cuda")

#: Stand-in for the machine the compile check targets (an H200: sm_90, 132 SMs).
SM90_SMS = 132


# --- device -------------------------------------------------------------------------------------


def interpreter_forced() -> bool:
    """True when Triton's library was decorated for the interpreter (TRITON_INTERPRET at import)."""
    return not isinstance(tl.standard.sum, JITFunction)


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """The device for tensors of the Triton path: the argument, else ``GDN_DEVICE``, else ``auto``."""
    if isinstance(device, torch.device):
        device = device.type
    choice = (device or os.environ.get("GDN_DEVICE") or "auto").strip().lower()
    if choice not in DEVICES:
        source = "device argument" if device else "GDN_DEVICE"
        raise ValueError(f"{source} must be one of {', '.join(DEVICES)}, found {choice!r}")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() and not interpreter_forced() else "cpu"
    if choice == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' was asked for, but torch sees no CUDA device")
        if interpreter_forced():
            raise ValueError(
                "device 'cuda' was asked for, but TRITON_INTERPRET was set when triton was imported, so "
                "Triton's library is interpreted-only in this process; unset TRITON_INTERPRET"
            )
    return torch.device(choice)


# --- allocation hook ------------------------------------------------------------------------------

_FILL: float | None = None


def empty(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every kernel output of this package is allocated here.

    Normally ``torch.empty``; inside :func:`fill_allocations` the tensor is filled with that value
    (NaN in the tests), so a lane that a kernel never writes shows up in the result.
    """
    if _FILL is None:
        return torch.empty(shape, dtype=dtype, device=device)
    fill = _FILL if dtype.is_floating_point else -1
    return torch.full(shape, fill, dtype=dtype, device=device)


@contextlib.contextmanager
def fill_allocations(value: float = float("nan")) -> Iterator[None]:
    """Fill every output that this package allocates with ``value`` (integers with -1)."""
    global _FILL
    previous, _FILL = _FILL, value
    try:
        yield
    finally:
        _FILL = previous


# --- targets and launch parameters ----------------------------------------------------------------

_COMPILE_ONLY: dict[str, Any] = {}


def interpreting(t: torch.Tensor) -> bool:
    """Whether a launch on ``t`` runs under the interpreter (CPU tensors, outside compile checks)."""
    return t.device.type != "cuda" and not _COMPILE_ONLY


def num_sms(t: torch.Tensor) -> int:
    if _COMPILE_ONLY:
        return SM90_SMS
    if t.device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(t.device).multi_processor_count


def next_pow2(n: int, floor: int = 1) -> int:
    return max(floor, triton.next_power_of_2(int(n)))


def dot_precision(dtype: torch.dtype) -> str:
    """``input_precision`` of ``tl.dot`` in the chunked delta rule, for activations of ``dtype``.

    Operands are always fp32 in registers (the interpreter's dot is exact fp32 and ignores this).
    bfloat16: ``tf32``. bf16 values are exact in tf32, so Q Kᵀ and K Kᵀ are exact; the fp32
    intermediates (inverse, W, U, state) keep 11 bits, still finer than the bf16 rounding of every
    activation. float16 and float32: ``tf32x3`` (three tensor-core passes, about fp32 accuracy).
    Not ``ieee`` for float32: an ieee fp32 dot compiles to unrolled FMA loops on CUDA cores;
    the chunk kernel's twelve 64 × 64 × 64 products then take ~80 s of ptxas per variant (measured
    here with Triton's bundled ptxas for sm_90) against ~16 s for tf32x3. tf32x3 agrees with the
    interpreter's exact products to ~1e-6 relative.
    """
    return {torch.float32: "tf32x3", torch.bfloat16: "tf32", torch.float16: "tf32x3"}[dtype]


# --- kernels: one Python function, compiled or interpreted ----------------------------------------


class Kernel:
    """A Triton kernel launched as ``kernel[grid](*args, **kwargs)``, like ``@triton.jit``.

    CUDA tensors: the compiled ``JITFunction``. CPU tensors: the ``InterpretedFunction``. Launch
    options (``num_warps``, ``num_stages``) are dropped by the interpreter.
    """

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self._jit: JITFunction | None = None
        self._interp = None

    @property
    def jit(self) -> JITFunction:
        if self._jit is None:
            self._jit = JITFunction(self.fn)
        return self._jit

    @property
    def interpreted(self):
        if self._interp is None:
            from triton.runtime.interpreter import InterpretedFunction

            self._interp = InterpretedFunction(self.fn)
        return self._interp

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._launch(grid, args, kwargs)

    def _launch(self, grid, args, kwargs):
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        if first is None:
            raise TypeError(f"{self.__name__}: a launch needs at least one tensor argument")
        if _COMPILE_ONLY:
            return _compile_only(self, args, kwargs)
        if first.device.type == "cuda":
            return self.jit[grid](*args, **kwargs)
        with _interpreting():
            return self.interpreted[grid](*args, **kwargs)


def kernel(fn) -> Kernel:
    """Decorator for this package's kernels (see the module docstring)."""
    return Kernel(fn)


_INTERP_DEPTH = 0


def _lang_anchor():  # its module globals hold ``tl`` and ``tl.core``, which _patch_lang patches
    return tl, tl_core


def _bf16_bits_rne(f32):
    """bfloat16 bits of float32 values, rounded to nearest even as CUDA (``cvt.rn.bf16.f32``) and
    torch round; NaN stays a quiet NaN."""
    import numpy as np

    u = np.ascontiguousarray(f32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


def _cast_rne(cast_impl):
    """Triton's interpreter (3.9) casts float32 to bfloat16 by truncating the low 16 bits, where a
    GPU rounds to nearest even: a bias of up to one bf16 ulp on every bf16 store and ``.to()``.
    This wraps ``InterpreterBuilder.cast_impl`` to round like the GPU; other casts are unchanged."""
    from triton.runtime.interpreter import TensorHandle

    def cast(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return TensorHandle(_bf16_bits_rne(src.data), dst_type.scalar)
        return cast_impl(self, src, dst_type)

    return cast


@contextlib.contextmanager
def _interpreting():
    """Patch ``tl`` and ``tl.core`` once for the whole launch, so nested library calls need not;
    float32 -> bfloat16 casts round to nearest even, as compiled (:func:`_cast_rne`)."""
    global _INTERP_DEPTH
    import numpy as np
    from triton.runtime.interpreter import InterpreterBuilder, _patch_lang

    scope = _patch_lang(_lang_anchor)
    cast_impl = InterpreterBuilder.cast_impl
    if not _INTERP_DEPTH:
        InterpreterBuilder.cast_impl = _cast_rne(cast_impl)
    _INTERP_DEPTH += 1
    try:
        with np.errstate(over="ignore", divide="ignore", invalid="ignore", under="ignore"):
            yield  # IEEE semantics as on a GPU: inf and NaN without NumPy's warnings
    finally:
        _INTERP_DEPTH -= 1
        InterpreterBuilder.cast_impl = cast_impl
        scope.restore()


_JIT_CALL = JITFunction.__call__


def _call_interpreted(self, *args, **kwargs):
    """``JITFunction.__call__`` during an interpreted launch: run the function interpreted."""
    if not _INTERP_DEPTH:
        return _JIT_CALL(self, *args, **kwargs)
    fn = self.__dict__.get("_gdn_interpreted")
    if fn is None:
        from triton.runtime.interpreter import InterpretedFunction

        fn = self.__dict__["_gdn_interpreted"] = InterpretedFunction(self.fn)
    return fn.rewrite()(*args, **kwargs)


JITFunction.__call__ = _call_interpreted


# --- compile check: build every launch for sm_90 without a GPU ------------------------------------

_TORCH_TO_TRITON = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
    torch.int64: "i64", torch.int32: "i32", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1",
}


@contextlib.contextmanager
def compile_only(arch: int = 90) -> Iterator[list[tuple[str, dict]]]:
    """Inside this block, launches compile for ``cuda:sm_{arch}`` (Triton's bundled ptxas) and run
    nothing; outputs stay as allocated. Yields the list of (kernel name, constexprs) compiled.

    Wrappers pick their GPU launch parameters here (``interpreting`` is False), so this checks
    the very kernels a GPU would build, on a machine without one.
    """
    from triton.backends.compiler import GPUTarget

    done: list[tuple[str, dict]] = []
    _COMPILE_ONLY.update(target=GPUTarget("cuda", arch, 32), done=done)
    try:
        yield done
    finally:
        _COMPILE_ONLY.clear()


def _compile_only(k: Kernel, args, kwargs):
    import inspect

    from triton.compiler import ASTSource

    params = list(inspect.signature(k.fn).parameters.values())
    bound = dict(zip((p.name for p in params), args))
    options = {n: kwargs.pop(n) for n in ("num_warps", "num_stages") if n in kwargs}
    bound.update(kwargs)
    signature, constexprs = {}, {}
    for p in params:
        value = bound[p.name]
        if p.annotation in (tl.constexpr, "tl.constexpr"):
            signature[p.name] = "constexpr"
            constexprs[p.name] = value
        elif isinstance(value, torch.Tensor):
            signature[p.name] = "*" + _TORCH_TO_TRITON[value.dtype]
        elif isinstance(value, bool):
            signature[p.name] = "i1"
        elif isinstance(value, int):
            signature[p.name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[p.name] = "fp32"
        else:
            raise TypeError(f"{k.__name__}: cannot type argument {p.name}={value!r} for a compile check")
    src = ASTSource(fn=k.jit, signature=signature, constexprs=constexprs)
    triton.compile(src, target=_COMPILE_ONLY["target"], options=options)
    _COMPILE_ONLY["done"].append((k.__name__, {**constexprs, **options}))
