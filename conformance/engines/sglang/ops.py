"""The math aliases of SGLang's ``fla/op.py`` (``exp = tl.exp`` and exp2, log, log2) as ``@triton.jit``
functions, for Triton's interpreter (conformance/engines/sglang/adapter.py, workaround 2; its page,
conformance/engines/sglang/README.md).

A module of its own: ``@triton.jit`` reads a function's source and needs ``triton.language`` among its
globals, and this module is imported only after the interpreter is chosen (``TRITON_INTERPRET`` is read when
``triton`` is first imported)."""

import triton
import triton.language as tl


@triton.jit
def exp(x):
    return tl.exp(x)


@triton.jit
def exp2(x):
    return tl.math.exp2(x)


@triton.jit
def log(x):
    return tl.log(x)


@triton.jit
def log2(x):
    return tl.log2(x)
