"""ONNX Runtime's LinearAttentionGate loses the small values of a Qwen3.5 GDN decay and update rate: its softplus
is ``log(1 + exp(x))`` in float32 (0 below x ~ -16.6) and its sigmoid is accurate in absolute, not relative, terms
(1e-5 relative near 0, 2e-3 at x = -8, several times the value past x = -16, 0 below -18).

Standalone: imports only onnxruntime, onnx, numpy and the standard library.

``com.microsoft::LinearAttentionGate`` (onnxruntime 1.32.0, what onnxruntime-genai's builder emits for every
Qwen3.5 linear-attention layer) computes ``decay = decay_scale * softplus(a + dt_bias)`` and ``beta = sigmoid(b)``.
Qwen3.5's long-memory heads are those with a small softplus (g near 0: decay exp(g) near 1), and a head whose b is
very negative barely writes its state (beta near 0): the ratio of those small values is what the recurrence keeps.
This script runs the op itself on the CPU execution provider over a grid of arguments and compares both outputs
with float64 ``log1p(exp(x))`` and ``1 / (1 + exp(-x))``, and with float32 emulations of the two formulas.

    python conformance/engines/onnxruntime/repros/onnxruntime_gates.py

Exit status: 1 while a defect reproduces, 0 once both are fixed, 3 when the op cannot be run here.
"""

from __future__ import annotations

import sys

import numpy as np

try:
    import onnxruntime as ort
    from onnx import TensorProto, helper
except ImportError:
    print("cannot run: needs onnxruntime and onnx (pip install onnxruntime==1.32.0 onnx)")
    sys.exit(3)


def gate(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(softplus(x), sigmoid(x)) as the op computes them: a = b = x, dt_bias = 0, decay_scale = -1."""
    node = helper.make_node("LinearAttentionGate", ["a", "dt_bias", "decay_scale", "b"], ["decay", "beta"],
                            domain="com.microsoft")
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [node], "gate",
        [helper.make_tensor_value_info(n, f, s) for n, s in (("a", [1, 1, None]), ("dt_bias", [None]),
                                                              ("decay_scale", [None]), ("b", [1, 1, None]))],
        [helper.make_tensor_value_info(n, f, None) for n in ("decay", "beta")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:  # an onnxruntime without the contrib op
        print(f"cannot run: onnxruntime {ort.__version__} has no com.microsoft::LinearAttentionGate ({exc})")
        sys.exit(3)
    a = x.astype(np.float32).reshape(1, 1, -1)
    n = x.size
    decay, beta = sess.run(None, {"a": a, "b": a, "dt_bias": np.zeros(n, np.float32),
                                  "decay_scale": -np.ones(n, np.float32)})
    return -decay.ravel().astype(np.float64), beta.ravel().astype(np.float64)


def main() -> int:
    x = np.linspace(-24.0, 24.0, 4801).astype(np.float32)
    xd = x.astype(np.float64)
    softplus, sigmoid = gate(x)
    sp64, sg64 = np.logaddexp(0.0, xd), 1.0 / (1.0 + np.exp(-xd))
    f = np.float32
    naive = np.log(f(1) + np.exp(x)).astype(np.float64)  # log(1 + exp(x)) in float32
    rel = lambda y, r: np.abs(y - r) / np.abs(r)  # noqa: E731
    print(f"onnxruntime {ort.__version__}, com.microsoft::LinearAttentionGate on the CPU EP, float32, "
          f"x in [-24, 24] step 0.01")
    print("\nsoftplus(x): relative error against float64 log1p(exp(x))")
    for lo, hi in ((-16.5, -10), (-10, -5), (-5, 0), (0, 24)):
        m = (x >= lo) & (x < hi)
        print(f"  x in [{lo:6}, {hi:4}): max {rel(softplus, sp64)[m].max():.2e}   "
              f"(log(1 + exp(x)) in float32: {rel(naive, sp64)[m].max():.2e})")
    zero = x[softplus == 0.0]
    print(f"  exactly 0 (no decay at all) for x <= {zero.max():.2f}" if zero.size else "  never 0")
    same = np.abs(softplus - naive) <= 2 * np.spacing(np.abs(naive).astype(np.float32)).astype(np.float64)
    print(f"  equal to log(1 + exp(x)) in float32 within 2 ulp at {same.mean():.1%} of the grid")
    print("\nsigmoid(x): relative error against float64 1 / (1 + exp(-x))")
    for lo, hi in ((-24, -18), (-18, -16), (-16, -10), (-10, -5), (-5, 5), (5, 24)):
        m = (x >= lo) & (x < hi)
        print(f"  x in [{lo:4}, {hi:4}): max {rel(sigmoid, sg64)[m].max():.2e}   "
              f"max absolute {np.abs(sigmoid - sg64)[m].max():.1e}")
    softplus_bad = bool(zero.size) or rel(softplus, sp64)[(x >= -16.5) & (x < -5)].max() > 1e-5
    sigmoid_bad = rel(sigmoid, sg64)[(x >= -16) & (x < 0)].max() > 1e-5
    print(f"\nsoftplus defect: {'reproduces' if softplus_bad else 'fixed'}; "
          f"sigmoid defect: {'reproduces' if sigmoid_bad else 'fixed'} "
          "(float32 log1p(exp(x)) and 1/(1 + exp(-x)) stay within 2e-7 relative on this grid)")
    return 1 if softplus_bad or sigmoid_bad else 0


if __name__ == "__main__":
    sys.exit(main())
