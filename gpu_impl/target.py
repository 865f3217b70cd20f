"""Where the Triton path runs: the device, the kernel target, and the output allocation hook.

One code path, two targets: a kernel launched on CUDA tensors is compiled (`JITFunction`), on CPU
tensors it runs under Triton's interpreter; the target follows the tensors. Decorate kernels with
`kernel` (never `@triton.jit`), so that neither `TRITON_INTERPRET` nor import order matters, and
launch them with every argument named. `launch_hook` and `record_launches` stand in for a GPU
(meta tensors welcome). Device choice: `device=`, else `GDN_DEVICE` (`auto` | `cpu` | `cuda`),
else `auto` (CUDA when torch sees a GPU and the interpreter was not forced).

Design (when Triton reads `TRITON_INTERPRET`, the shim): docs/gpu.md §12.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from .interpreter import interpreting as _interpreting
from .interpreter import run_grid

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
    if choice.startswith("cuda:") and choice[5:].isdigit():  # torch's own spelling of an indexed device
        choice = "cuda"
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
    # a CUDA tensor reports its index (cuda:0): the device this package compares against names it too
    return torch.device("cuda", torch.cuda.current_device()) if choice == "cuda" else torch.device("cpu")


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

#: CUDA's limits on a launch grid: x up to 2^31 - 1 programs, y and z up to 65535.
GRID_LIMITS = (2**31 - 1, 65535, 65535)

#: Triton's interpreter keeps its grid (``interpreter_builder``) and its patch of ``tl`` in process globals: one
#: interpreted launch at a time per process (a context-parallel case's ranks run as threads without ``--world``)
_INTERPRETER_LOCK = threading.RLock()
_HOOK: list[Any] = []


@contextlib.contextmanager
def launch_hook(hook) -> Iterator[Any]:
    """Inside this block every launch calls ``hook.launch(kernel, grid, kwargs)`` instead of running.

    Wrappers then pick their GPU launch parameters (:func:`interpreting` is False and
    :func:`num_sms` says 132), so a hook sees the very launches a GPU would get.
    """
    _HOOK.append(hook)
    try:
        yield hook
    finally:
        _HOOK.remove(hook)


def interpreting(t: torch.Tensor) -> bool:
    """Whether a launch on ``t`` runs under the interpreter (CPU tensors, outside launch hooks)."""
    return t.device.type == "cpu" and not _HOOK


def num_sms(t: torch.Tensor) -> int:
    if _HOOK or t.device.type == "meta":
        return SM90_SMS
    if t.device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(t.device).multi_processor_count


def reset_flags(reset: torch.Tensor) -> torch.Tensor:
    """A bool [B] reset mask as the kernels read it: uint8, a view (bool loads are not portable)."""
    return reset.view(torch.uint8) if reset.dtype == torch.bool else reset


def next_pow2(n: int, floor: int = 1) -> int:
    return max(floor, triton.next_power_of_2(int(n)))


def heads_per_program(t: torch.Tensor, kernel_name: str, heads: int, head_lanes: int, lanes: int,
                      asked: int | None = None) -> int:
    """Heads (or head slots) per program of a kernel that can take several (a power of two): ``asked``
    if given (tests run each form), 1 on a GPU (a head's tile per program: the compile table's form,
    docs/gpu.md), under the interpreter as many of the ``heads`` as fit ``lanes`` lanes of
    ``head_lanes`` each: the interpreter's cost is one Python step per operation of a program whatever
    the width of its tiles, so one program over every head does the same arithmetic per element in
    ``heads`` times fewer steps."""
    if asked is not None:
        if asked < 1 or asked & (asked - 1):
            raise ValueError(f"{kernel_name}: heads_per_program must be a power of two, found {asked}")
        return asked
    if not interpreting(t):
        return 1
    return max(1, min(next_pow2(heads), lanes // head_lanes))


def dot_precision(dtype: torch.dtype) -> str:
    """``input_precision`` of ``tl.dot`` in the chunked delta rule, for activations of ``dtype``.

    Operands are always fp32 in registers. bfloat16: ``tf32``, i.e. each operand truncated to
    10 mantissa bits by the tensor core (:mod:`.interpreter` emulates it). bf16 values are exact
    in tf32, so Q Kᵀ and K Kᵀ are exact; the fp32 intermediates (inverse, W, U, state) lose
    up to 2^-10 relative per product, still finer than the bf16 rounding of every activation.
    float16 and float32: ``tf32x3`` (three tensor-core passes, about fp32 accuracy).
    Not ``ieee`` for float32: an ieee fp32 dot compiles to unrolled FMA loops on CUDA cores;
    the chunk kernel's twelve 64 × 64 × 64 products then take ~80 s of ptxas per variant (measured
    here with Triton's bundled ptxas for sm_90) against ~16 s for tf32x3.
    """
    return {torch.float32: "tf32x3", torch.bfloat16: "tf32", torch.float16: "tf32x3"}[dtype]


# --- kernels: one Python function, compiled or interpreted ----------------------------------------


@dataclass(frozen=True)
class Launch:
    """One launch as :func:`record_launches` saw it: tensors as (shape, dtype, strides), so that
    recording keeps no tensor alive (the memory check measures what the layer keeps)."""

    kernel: str
    grid: tuple[int, ...]
    args: dict[str, Any]


def _describe(value):
    if isinstance(value, torch.Tensor):
        return tuple(value.shape), value.dtype, value.stride()
    return value


class Kernel:
    """A Triton kernel launched as ``kernel[grid](name=value, ...)``, every argument by name.

    CUDA tensors: the compiled ``JITFunction``. CPU tensors: the ``InterpretedFunction``. Launch
    options (``num_warps``, ``num_stages``) are dropped by the interpreter. A launch that passes
    an argument by position, misses one or names an unknown one is refused with a ``TypeError``
    (the interpreter would silently drop an unknown keyword). Parameters with a default (the
    packed-call variants' pointers and flags, which default to the plain path) may be left out:
    the plain launches then bind, specialise and compile exactly as before those were added.
    """

    OPTIONS = ("num_warps", "num_stages")

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        signature = inspect.signature(fn).parameters
        self.params = tuple(signature)
        self.optional = frozenset(n for n, p in signature.items() if p.default is not inspect.Parameter.empty)
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
        def launch(*args, **kwargs):
            if args:
                raise TypeError(f"{self.__name__}: launch with keyword arguments (name=value), found "
                                f"{len(args)} positional")
            return self._launch(tuple(int(g) for g in grid), kwargs)

        return launch

    def check_arguments(self, kwargs: dict) -> None:
        missing = [p for p in self.params if p not in kwargs and p not in self.optional]
        unknown = [k for k in kwargs if k not in self.params and k not in self.OPTIONS]
        if missing or unknown:
            raise TypeError(f"{self.__name__}: expected the arguments {', '.join(self.params)}; "
                            f"missing {missing or 'none'}, unknown {unknown or 'none'}")

    def _launch(self, grid: tuple[int, ...], kwargs: dict):
        self.check_arguments(kwargs)
        if any(not 1 <= g <= limit for g, limit in zip(grid, GRID_LIMITS)) or not 1 <= len(grid) <= 3:
            raise ValueError(f"{self.__name__}: grid {list(grid)} is outside CUDA's limits "
                             f"(1 to {GRID_LIMITS[0]} programs on x, 1 to 65535 on y and z)")
        first = next((a for a in kwargs.values() if isinstance(a, torch.Tensor)), None)
        if first is None:
            raise TypeError(f"{self.__name__}: a launch needs at least one tensor argument")
        if _HOOK:
            return _HOOK[-1].launch(self, grid, kwargs)
        if first.device.type == "cuda":
            return self.jit[grid](**kwargs)
        if first.device.type == "meta":
            raise ValueError(f"{self.__name__}: tensors on the meta device can only be compiled "
                             "(compile_check) or recorded (record_launches), not run")
        with _INTERPRETER_LOCK, _interpreting():
            return run_grid(self.interpreted, grid, kwargs)


def kernel(fn) -> Kernel:
    """Decorator for this package's kernels (see the module docstring)."""
    return Kernel(fn)


class _Recorder:
    def __init__(self):
        self.launches: list[Launch] = []

    def launch(self, k: Kernel, grid, kwargs):
        self.launches.append(Launch(k.__name__, grid, {n: _describe(v) for n, v in kwargs.items()}))


@contextlib.contextmanager
def record_launches() -> Iterator[list[Launch]]:
    """Inside this block launches are recorded (kernel, grid, arguments) and run nothing."""
    with launch_hook(_Recorder()) as rec:
        yield rec.launches


_JIT_CALL = JITFunction.__call__


def _call_interpreted(self, *args, **kwargs):
    """``JITFunction.__call__`` during an interpreted launch: run the function interpreted."""
    from . import interpreter

    if not interpreter._DEPTH:
        return _JIT_CALL(self, *args, **kwargs)
    fn = self.__dict__.get("_gdn_interpreted")
    if fn is None:
        from triton.runtime.interpreter import InterpretedFunction

        fn = self.__dict__["_gdn_interpreted"] = InterpretedFunction(self.fn)
    return fn.rewrite()(*args, **kwargs)


JITFunction.__call__ = _call_interpreted
