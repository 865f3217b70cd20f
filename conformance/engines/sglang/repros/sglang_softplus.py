"""SGLang's GDN gating loses the small values of a Qwen3.5 decay: ``log(1 + exp(x))`` in float32 instead of
``log1p(exp(x))``.

Standalone: imports only sglang's kernel module, torch, triton, numpy and the standard library. Exit 0 when
fixed, 1 when it reproduces, 3 when it cannot run (SGLang not installed, or triton imported without the
interpreter on a machine with no GPU).

Qwen3.5's gated delta rule decays its state by ``exp(g)``, ``g = -exp(A_log) * softplus(a + dt_bias)``. SGLang's
prefill gating kernel (``sglang/kernels/ops/attention/linear/fused_gdn_gating.py``, ``fused_gdn_gating_kernel``,
which ``GDNAttnBackend._prefill_gates`` calls) computes::

    softplus_x = tl.where(beta * x <= threshold, (1 / beta) * tl.log(1 + tl.exp(beta * x)), x)

in float32. For x < 0, ``1 + exp(x)`` rounds exp(x) to the float32 spacing of 1 (2^-24 relative to 1) before the
log, so softplus carries an absolute error of up to ~6e-8 whatever its size: a relative error of ~6e-8 / e^x
(about 7e-4 at x = -11), and exactly 0 (g = 0: that head never decays) below x ~ -16.6, where log1p(exp(x)) ~ e^x
is perfectly representable. The same formula as llama.cpp's ggml softplus (llamacpp_softplus.py).

This script runs SGLang's own kernel (compiled on a GPU, else in Triton's interpreter) with A_log = 0 and
dt_bias = 0, so g = -softplus(a), and compares it with float64 log1p(exp(a)).

    python conformance/engines/sglang/repros/sglang_softplus.py
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import math
import os
import sys
import types

import numpy as np

CANNOT_RUN = 3


def fused_gdn_gating():
    """SGLang's ``fused_gdn_gating``, imported without ``sglang/__init__.py`` (which pulls its serving
    frontend: IPython and more) — the kernel module itself imports only torch and triton."""
    try:
        import torch
    except ImportError:
        sys.exit(CANNOT_RUN)
    if not torch.cuda.is_available():
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            print("no GPU and triton already imported without TRITON_INTERPRET=1", file=sys.stderr)
            sys.exit(CANNOT_RUN)
        os.environ["TRITON_INTERPRET"] = "1"
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        print("needs SGLang: pip install --no-deps sglang==0.5.23", file=sys.stderr)
        sys.exit(CANNOT_RUN)
    root = next(iter(spec.submodule_search_locations))
    for name in ("sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention"):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = [os.path.join(root, *name.split(".")[1:])]
            module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            module.__spec__.submodule_search_locations = module.__path__
            sys.modules[name] = module
    from sglang.kernels.ops.attention.linear.fused_gdn_gating import fused_gdn_gating as gating

    return torch, gating


def main() -> int:
    torch, gating = fused_gdn_gating()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = np.array([-2.0, -5.0, -8.0, -11.0, -14.0, -16.0, -17.0, -18.0], dtype=np.float32)
    H = x.size
    a = torch.tensor(x, device=device)[None]  # one token, one value head per x
    zeros = torch.zeros(H, dtype=torch.float32, device=device)
    g, _ = gating(zeros, a, torch.zeros_like(a), zeros)  # A_log = 0, dt_bias = 0: g = -softplus(a)
    got = -g.reshape(-1).double().cpu().numpy()
    exact = np.array([math.log1p(math.exp(float(v))) for v in x])
    good = np.log1p(np.exp(x)).astype(np.float32).astype(np.float64)  # float32 log1p(exp(x)): what it should be
    print(f"SGLang fused_gdn_gating ({device}{', interpreted' if device == 'cpu' else ''}): softplus against "
          f"float64 log1p(exp(x))")
    print(f"{'x':>7} {'float64':>12} {'sglang':>12} {'rel err':>10} {'log1pf rel err':>15}")
    for v, e, s, ok in zip(x, exact, got, good):
        print(f"{v:7.1f} {e:12.5e} {s:12.5e} {abs(s - e) / e:10.2e} {abs(ok - e) / e:15.2e}")
    worst = float(np.max(np.abs(got - exact) / exact))
    print(f"\nworst relative error {worst:.2e} (float32 log1p(exp(x)): {np.max(np.abs(good - exact) / exact):.2e});"
          " where SGLang returns 0, g = 0: the head's state never decays")
    if worst <= 1e-5:
        print("SGLang's gating keeps the small values now: the finding is fixed in this version")
        return 0
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
