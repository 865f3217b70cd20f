"""llama.cpp's softplus loses the small values of a Qwen3.5 GDN decay: ``logf(1 + expf(x))`` instead of
``log1pf(expf(x))``.

Standalone: imports only llama_cpp (for the ggml libraries it ships), numpy and the standard library.

Qwen3.5's gated delta rule decays its state by ``exp(g)``, ``g = -exp(A_log) * softplus(a + dt_bias)``. llama.cpp
computes the softplus with ggml's ``GGML_OP_SOFTPLUS`` (``ggml_softplus``, qwen35.cpp's
``build_layer_attn_linear``), whose CPU kernel (ggml/src/ggml-cpu/unary-ops.cpp ``op_softplus``; the same formula is
``ggml_compute_softplus_f32`` in ggml-impl.h) is::

    (x > 20.0f) ? x : logf(1.0f + expf(x))

For x < 0, ``1.0f + expf(x)`` rounds expf(x) to the float32 spacing of 1 (2^-24 relative to 1) before the log, so
the result carries an absolute error of up to ~6e-8 whatever its size: a relative error of ~6e-8 / e^x (measured:
7e-4 at x = -11, 6e-2 at x = -16), and exactly 0 (g = 0: no decay at all) below x ~ -16.6, where expf(x) is under
half the float32 spacing of 1, although log1p(exp(x)) ~ e^x is perfectly representable. Those are the
long-memory heads of a trained layer (small softplus, g near 0). ``log1pf(expf(x))`` has ~1 ulp relative error
over the whole range.

This script runs ggml's own op on the CPU backend (ctypes into libggml-base / libggml-cpu of the installed
llama-cpp-python) and compares it with float64 log1p(exp(x)).

    python conformance/engines/llamacpp/repros/llamacpp_softplus.py
"""

from __future__ import annotations

import ctypes
import math
import sys
from pathlib import Path

import numpy as np

#: the exit status when the repro cannot run (the engine is not installed here): neither fixed (0) nor reproduced (1)
CANNOT_RUN = 3

try:
    import llama_cpp
except ImportError:
    print("cannot run: needs llama-cpp-python (built from its sdist; conformance/engines/llamacpp/README.md)",
          file=sys.stderr)
    sys.exit(CANNOT_RUN)

LIB = Path(llama_cpp.__file__).parent / "lib"


def _lib(stem: str) -> ctypes.CDLL:
    found = sorted(LIB.glob(f"lib{stem}.so*")) + sorted(LIB.glob(f"lib{stem}.dylib")) + sorted(LIB.glob(f"{stem}.dll"))
    return ctypes.CDLL(str(found[0]), mode=ctypes.RTLD_GLOBAL)


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def ggml_softplus_f32(x: np.ndarray) -> np.ndarray:
    base, cpu = _lib("ggml-base"), _lib("ggml-cpu")
    base.ggml_init.restype = ctypes.c_void_p
    base.ggml_init.argtypes = [InitParams]
    base.ggml_new_tensor_1d.restype = ctypes.c_void_p
    base.ggml_new_tensor_1d.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64]
    base.ggml_softplus.restype = ctypes.c_void_p
    base.ggml_softplus.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    base.ggml_new_graph.restype = ctypes.c_void_p
    base.ggml_new_graph.argtypes = [ctypes.c_void_p]
    base.ggml_build_forward_expand.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    base.ggml_get_data.restype = ctypes.c_void_p
    base.ggml_get_data.argtypes = [ctypes.c_void_p]
    base.ggml_free.argtypes = [ctypes.c_void_p]
    cpu.ggml_graph_compute_with_ctx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]

    n = x.size
    ctx = base.ggml_init(InitParams(64 * 1024 * 1024, None, False))
    a = base.ggml_new_tensor_1d(ctx, 0, n)  # GGML_TYPE_F32
    ctypes.memmove(base.ggml_get_data(a), np.ascontiguousarray(x, dtype=np.float32).ctypes.data, 4 * n)
    y = base.ggml_softplus(ctx, a)
    graph = base.ggml_new_graph(ctx)
    base.ggml_build_forward_expand(graph, y)
    cpu.ggml_graph_compute_with_ctx(ctx, graph, 1)
    out = np.ctypeslib.as_array((ctypes.c_float * n).from_address(base.ggml_get_data(y))).copy()
    base.ggml_free(ctx)
    return out


def main() -> int:
    x = np.array([-2.0, -5.0, -8.0, -11.0, -14.0, -16.0, -17.0, -18.0, -20.0], dtype=np.float32)
    got = ggml_softplus_f32(x).astype(np.float64)
    exact = np.array([math.log1p(math.exp(float(v))) for v in x])
    good = np.log1p(np.exp(x)).astype(np.float32).astype(np.float64)  # log1pf(expf(x)): what it should be
    print(f"llama-cpp-python {llama_cpp.__version__}: ggml_softplus (CPU) against float64 log1p(exp(x))")
    print(f"{'x':>7} {'float64':>12} {'ggml':>12} {'ggml rel err':>13} {'log1pf rel err':>15}")
    for v, e, g, ok in zip(x, exact, got, good):
        print(f"{v:7.1f} {e:12.5e} {g:12.5e} {abs(g - e) / e:13.2e} {abs(ok - e) / e:15.2e}")
    worst = float(np.max(np.abs(got - exact) / exact))
    # what it does to the decay of one long-memory head: g = -exp(A_log) * softplus(a + dt_bias), A_log = 0
    print(f"\nworst relative error {worst:.2e} (float32 log1p(exp(x)): {np.max(np.abs(good - exact) / exact):.2e});"
          " below x ~ -16.6 ggml returns 0: g = 0, the head's state never decays")
    if worst <= 1e-5:
        print("ggml's softplus keeps the small values now: the finding is fixed in this version")
        return 0
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
