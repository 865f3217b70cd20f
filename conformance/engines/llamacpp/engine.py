"""llama.cpp as an engine: its qwen35 / qwen35moe model paths through llama-cpp-python (``adapter.py``)."""

from ..schema import Allow, Engine, Finding

ENGINE = Engine(
    name="llamacpp",
    impl="llamacpp",
    judged="end_to_end",
    profiles=("f32", "bf16"),
    modules=("llama_cpp", "torch", "transformers"),
    packages=("llama-cpp-python", "torch", "transformers"),
    install='CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF" pip install -e '
            "'.[llamacpp]' (llama-cpp-python 0.3.36 built from its sdist, ~20 min), and its sdist unpacked in "
            '~/.cache/gdncheck (the converter)',
    about="llama.cpp's qwen35 / qwen35moe model paths through llama-cpp-python: convert_hf_to_gguf.py, llama_decode "
          "with x as embeddings, intermediates by cb_eval, states by its state API "
          "(conformance/engines/llamacpp/adapter.py)",
    fallback="gdncheck.conformance.engines.llamacpp.adapter:llamacpp",
)

REPROS = "conformance/engines/llamacpp/repros"

SOFTPLUS = ("ggml's CPU softplus is (x > 20) ? x : logf(1.0f + expf(x)) in f32: for negative x an absolute "
            "error near 6e-8 (relative 7e-4 at x = -11), and exactly 0 below x ~ -16.6, so g = 0 there and "
            "that head never decays; llama.cpp's g equals an f32 emulation of the formula to ~1 ulp")

# llama.cpp's whole layer on softplus-edges (end-to-end): the head that never decays carries its error on to
# the state, core, the gated norm and the output. Not re-measured where llama-cpp-python is not built: the
# allowance is SGLang's measured state and core error on the same case (its softplus is the same formula),
# for every stage after the delta rule, and no NaN
DOWNSTREAM_F32 = tuple(Allow(stage, "*", 2e11) for stage in ("delta_rule", "gated_norm", "out_proj"))
DOWNSTREAM_BF16 = tuple(Allow(stage, "*", 750.0) for stage in ("delta_rule", "gated_norm", "out_proj"))

FINDINGS = (
    # measured (docs/engines.md, 2026-12-04): g off by 1-7.5x its bound, 4.1e9x on softplus-edges (f32; 11x in
    # bf16), never NaN
    Finding(
        case="softplus-edges", profile="f32", cls="deviation", explanation=SOFTPLUS,
        repro=f"{REPROS}/llamacpp_softplus.py",
        expect={"kind": "tensor", "stage": "gates", "tensor": "g", "nan": False, "ratio": (1e8, 1e11)},
        also=DOWNSTREAM_F32),
    Finding(
        case="softplus-edges", profile="bf16", cls="deviation", explanation=SOFTPLUS,
        repro=f"{REPROS}/llamacpp_softplus.py",
        expect={"kind": "tensor", "stage": "gates", "tensor": "g", "nan": False, "ratio": (3.0, 40.0)},
        also=DOWNSTREAM_BF16),
    *(Finding(
        case=prefix, profile="f32", cls="deviation", explanation=SOFTPLUS, repro=f"{REPROS}/llamacpp_softplus.py",
        expect={"kind": "tensor", "stage": "gates", "tensor": "g", "nan": False, "ratio": (1.0, 20.0)})
      for prefix in ("prefill-decode", "chunked", "segments", "snapshot-replay", "mismatch-midstream",
                     "batch-positions", "long-decode", "real-heads", "qk-eps", "gated-eps", "state-norms", "prefill_",
                     "moe-e256-k8", "moe-exact-tie")),
    Finding(
        case="moe-exact-tie", profile="bf16", cls="convention",
        explanation="llama.cpp routes with ggml_argsort_top_k, whose CPU kernel is std::sort with a comparator on "
        "the probability alone (ggml-cpu/ops.cpp, ggml_compute_forward_argsort_f32): which of exactly tied experts at "
        "the k boundary it keeps is the C++ library's (measured here: the higher index); docs/moe.md, Ties",
        may_not_occur=True),
    Finding(
        case="restore-mismatch", profile="f32", cls="deviation",
        explanation=SOFTPLUS + "; on this case the g error accumulates into the state (the float64 "
        "reference with that softplus alone swapped in gives the same state error: 3.9e-12 against 4.1e-12)",
        repro=f"{REPROS}/llamacpp_softplus.py",
        expect={"kind": "tensor", "stage": "delta_rule", "tensor": "recurrent_state", "nan": False,
                "ratio": (1.0, 5.0)}),
)
