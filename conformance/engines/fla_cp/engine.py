"""flash-linear-attention's context parallelism as an engine: ``fla.ops.cp`` (fla's CP conv and gated delta rule)
at world 2 on gloo, stage-isolated, a CP-only port (``adapter.py``; its rank program ``cp.py``)."""

from ..schema import Engine

ENGINE = Engine(
    name="fla-cp",
    impl="fla_cp",
    judged="stage_isolated",
    profiles=("f32",),
    modules=("fla", "einops", "torch"),
    packages=("fla-core", "torch"),
    install="pip install fla-core einops",
    about="flash-linear-attention's context parallelism (fla-core's fla.ops.cp: causal_conv1d_cp and "
          "chunk_gated_delta_rule with a CP context) on spawned gloo ranks, Triton's interpreter without a GPU, "
          "fed the goldens' qkv, g and beta per segment; qkv_conv and core judged rank by rank "
          "(conformance/engines/fla_cp/adapter.py)",
    fallback="gdncheck.conformance.engines.fla_cp.adapter:fla_cp",
    tags=("sharded",),  # a CP-only port: its row is the sharded cases (the unsharded ones are the fla row's)
)

FINDINGS = ()
