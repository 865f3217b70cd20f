"""llama.cpp's ggml_gated_delta_net op as an engine, stage-isolated (``adapter.py``; the whole layer through
llama.cpp is the engine ``llamacpp``)."""

from ..schema import Engine, Finding

ENGINE = Engine(
    name="ggml",
    impl="ggml",
    judged="stage_isolated",
    profiles=("f32",),
    modules=("llama_cpp",),
    packages=("llama-cpp-python",),
    install='CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF" pip install '
            '--no-binary llama-cpp-python "llama-cpp-python==0.3.36" (~20 min to build)',
    about="llama.cpp's ggml_gated_delta_net op from the libggml llama-cpp-python installs (ctypes, CPU backend), the "
          "delta_rule stage alone from golden inputs; f32 only: the op takes f32 tensors only "
          "(conformance/engines/ggml/adapter.py)",
    fallback="gdncheck.conformance.engines.ggml.adapter:ggml",
    option_values={"threads": (1, 2, 4)},
)

NOTHING_JUDGED = ("ggml_gated_delta_net is one op of llama.cpp's graph: stage-isolated, the adapter runs the "
                  "delta_rule stage only, and this case's fixture keeps no delta_rule inputs ({what}), so no "
                  "tensor is judged and the coverage rule fails it; a limit of a one-stage adapter, not a ggml "
                  "deviation (the whole layer through llama.cpp: engine llamacpp)")

FINDINGS = (
    Finding(
        case="real-heads", profile="*", cls="missing_feature",
        explanation=NOTHING_JUDGED.format(what="a real-heads case keeps no *_in state"),
        expect={"kind": "nothing_judged"}),
)
