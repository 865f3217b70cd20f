"""flash-linear-attention as an engine: fla-core's gated delta rule kernels, stage-isolated (``adapter.py``);
its context parallelism is the engine fla-cp (conformance/engines/fla_cp/)."""

from ..schema import Engine, Finding

ENGINE = Engine(
    name="fla",
    impl="fla",
    judged="stage_isolated",
    profiles=("f32", "bf16"),
    modules=("fla", "einops", "torch"),
    packages=("fla-core", "torch"),
    install="pip install fla-core einops",
    about="flash-linear-attention's gated delta rule (fla-core): its Triton kernels by default (chunk; Triton's "
          "interpreter without a GPU), the delta_rule stage alone from golden inputs "
          "(conformance/engines/fla/adapter.py)",
    fallback="gdncheck.conformance.engines.fla.adapter:fla",
    options={"kernel": "chunk"},
    option_values={"kernel": ("naive", "naive_chunk", "fused_recurrent", "chunk"), "chunk_size": (16, 32, 64)},
)

NOTHING_JUDGED = ("fla-core ships kernels, not the Qwen3.5 layer: stage-isolated, the adapter runs the delta_rule "
                  "stage only, and this case's fixture keeps no delta_rule inputs ({what}), so no tensor is judged "
                  "and the coverage rule fails it; a limit of a one-stage adapter, not an fla deviation")

FINDINGS = (
    Finding(
        case="real-heads", profile="*", cls="missing_feature",
        explanation=NOTHING_JUDGED.format(what="a real-heads case keeps no *_in state"),
        expect={"kind": "nothing_judged"}),
    # the depth cases whose fixture keeps only x, qkv_conv, core, out and the states (measured 2026-12-07, f32 and
    # bf16: nothing judged)
    *(Finding(
        case=prefix, profile="*", cls="missing_feature",
        explanation=NOTHING_JUDGED.format(what="it keeps only x, qkv_conv, core, out and the states: no q, k, v, "
                                          "g or beta"),
        expect={"kind": "nothing_judged"})
      for prefix in ("state-norms-gva2", "state-norms-gva4", "f16-state-gva2", "f16-state-mha", "long-decode-mha")),
)
