"""llama.cpp as a port: ``gdncheck run gdncheck.conformance.engines.llamacpp.adapter:llamacpp --profile f32|bf16``.

A factory of the port contract (:mod:`gdncheck.harness.contract`) around llama.cpp's own ``qwen35`` and
``qwen35moe`` model paths through llama-cpp-python's ctypes API: a one-layer checkpoint per case converted by
llama.cpp's ``convert_hf_to_gguf.py``, ``x`` fed as embeddings, intermediates by ``cb_eval``, states by its
state API.

What it exposes, what it cannot and why, the engine versions it knows: conformance/engines/llamacpp/README.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import importlib.util
import io
import logging
import os
import re
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.errors import GDNError
from gdncheck.experts import EXPERTS_DOWN, EXPERTS_GATE_UP, moe_expected_shapes, unstack_experts
from gdncheck.harness import NotApplicable, is_strict, serving_ops

log = logging.getLogger("gdncheck.ports.llamacpp")

TESTED = "0.3.36"
NOT_INSTALLED = ("implementation 'llamacpp' needs llama-cpp-python (built from its sdist: "
                 "CMAKE_ARGS=\"-DGGML_NATIVE=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF\" "
                 "pip install --no-binary llama-cpp-python llama-cpp-python), not installed here")
PROFILES = {"f32": "f32", "bf16": "bf16"}  # profile -> converter --outtype
VOCAB = 16
#: llama.cpp's block-0 tensor names (cb_eval) -> what the adapter takes them for
CAPTURED = {
    "model.input_embed": "input",
    "attn_norm-0": "x_norm",
    "linear_attn_qkv_mixed-0": "qkv",
    "z-0": "z",
    "alpha-0": "a",
    "beta-0": "b",
    "conv_input-0": "conv_window",
    "conv_output_silu-0": "qkv_conv",
    "q_conv_predelta-0": "q",
    "k_conv_predelta-0": "k",
    "gate-0": "g",
    "beta_sigmoid-0": "beta",
    "attn_output-0": "core",
    "new_state-0": "recurrent_state",
    "final_output-0": "core_gated",
    "linear_attn_out-0": "attn_out",
    "attn_residual-0": "h",
    "attn_post_norm-0": "h_norm",
    "ffn_out-0": "mlp_out",
    "l_out-0": "out",
}
#: the sparse block's tensors of block 0 in llama.cpp's qwen35moe graph (``build_layer_ffn``, and
#: ``llm_graph_context::build_moe_ffn`` with softmax gating and ``norm_w``) -> what the adapter takes them for
MOE_CAPTURED = {
    "ffn_moe_logits-0": "router_logits",
    "ffn_moe_topk-0": "selected_experts",
    "ffn_moe_weights_norm-0": "routing_weights",
    "ffn_moe_out-0": "experts_out",
    "ffn_shexp_gated-0": "shared_out",
}
#: captured where llama.cpp computes them as graph nodes: an embeddings batch's input is a leaf, never evaluated
OPTIONAL = ("model.input_embed",)
#: the largest ubatch (tokens over all sequences) of one llama_decode; longer calls are fed in pieces
MAX_UBATCH = 2048
_GGML_F32, _GGML_F16, _GGML_I32, _GGML_BF16 = 0, 1, 26, 30


class LlamaCppRefused(Exception):  # noqa: N818 - carries the code of what llama.cpp refused
    """llama.cpp (its converter, loader or C API) refused; ``code`` is the FORMAT.md §6 code it stands for."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


# --- the engine -----------------------------------------------------------------------------------------
class _TensorHead(ctypes.Structure):
    """The leading fields of ``struct ggml_tensor`` (ggml.h): type, buffer, ne[4], nb[4]."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4)]


@dataclass
class Engine:
    llama: Any  # llama_cpp.llama_cpp
    ggml: Any  # ctypes.CDLL of libggml-base
    version: str
    source: Path  # vendor/llama.cpp of the matching sdist
    n_pos_per_embd: int = 4
    log_lines: list = field(default_factory=list)
    n_logged: int = 0  # lines ever logged (log_lines keeps the last 400)

    def logged_since(self, mark: int) -> str:
        return "".join(self.log_lines[max(0, len(self.log_lines) - (self.n_logged - mark)):])


_ENGINE: Engine | None = None
_LOCK = threading.RLock()


def _find_source(option: str | None, version: str) -> Path:
    cache = Path.home() / ".cache" / "gdncheck"
    candidates = [option, os.environ.get("GDN_LLAMACPP_SOURCE"), str(cache / f"llama_cpp_python-{version}"),
                  str(cache / f"llama-cpp-python-{version}")]
    for cand in filter(None, candidates):
        p = Path(cand).expanduser()
        for root in (p / "vendor" / "llama.cpp", p):
            if (root / "convert_hf_to_gguf.py").is_file() and (root / "gguf-py" / "gguf").is_dir():
                return root
    raise GDNError(
        f"implementation 'llamacpp' converts with the convert_hf_to_gguf.py vendored in llama-cpp-python {version}'s "
        "sdist, not found: pip download --no-binary :all: --no-deps llama-cpp-python=="
        f"{version} -d /tmp/d && mkdir -p ~/.cache/gdncheck && tar xzf /tmp/d/llama_cpp_python-{version}.tar.gz -C "
        f"~/.cache/gdncheck (or --option source=DIR, or GDN_LLAMACPP_SOURCE=DIR)")


def engine(source: str | None = None) -> Engine:
    """Import llama-cpp-python (one line saying how to install it otherwise) and find the vendored converter."""
    global _ENGINE
    with _LOCK:
        if _ENGINE is not None:
            return _ENGINE
        if importlib.util.find_spec("llama_cpp") is None:
            raise GDNError(NOT_INSTALLED)
        try:
            llama_cpp = importlib.import_module("llama_cpp")
            llama = importlib.import_module("llama_cpp.llama_cpp")
        except (ImportError, OSError) as exc:
            raise GDNError(f"{NOT_INSTALLED} (import failed: {exc})") from None
        version = str(getattr(llama_cpp, "__version__", "?"))
        if version.split(".")[:2] != TESTED.split(".")[:2]:
            log.warning("implementation 'llamacpp' was tested with llama-cpp-python %s, found %s", TESTED, version)
        lib_dir = Path(llama_cpp.__file__).parent / "lib"
        names = sorted(lib_dir.glob("libggml-base.*")) + sorted(lib_dir.glob("ggml-base.*"))
        if not names:
            raise GDNError(f"implementation 'llamacpp': no libggml-base shared library in {lib_dir}")
        ggml = ctypes.CDLL(str(names[0]))
        ggml.ggml_get_name.restype = ctypes.c_char_p
        ggml.ggml_get_name.argtypes = [ctypes.c_void_p]
        ggml.ggml_nbytes.restype = ctypes.c_size_t
        ggml.ggml_nbytes.argtypes = [ctypes.c_void_p]
        ggml.ggml_backend_tensor_get.restype = None
        ggml.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
        eng = Engine(llama, ggml, version, _find_source(source, version))
        _install_log(eng)
        llama.llama_backend_init()
        _ENGINE = eng
        return eng


_LOG_CB = None


def _install_log(eng: Engine) -> None:
    """llama.cpp's log through ``llama_log_set``: kept (the last lines name what the loader refused), not
    printed unless GDN_LLAMACPP_LOG is set."""
    global _LOG_CB
    echo = bool(os.environ.get("GDN_LLAMACPP_LOG"))

    def _log(level, text, user_data):
        msg = text.decode("utf-8", "replace") if text else ""
        eng.log_lines.append(msg)
        eng.n_logged += 1
        del eng.log_lines[:-400]
        if echo:
            sys.stderr.write(msg)

    _LOG_CB = eng.llama.llama_log_callback(_log)
    eng.llama.llama_log_set(_LOG_CB, ctypes.c_void_p())


# --- what llama.cpp can be asked ------------------------------------------------------------------------
def check_case(config: Mapping[str, Any], program: list[Mapping[str, Any]]) -> None:
    """Called before gdncheck parses the config: what llama.cpp cannot be asked at all."""
    serving = serving_ops(program)
    if serving:
        raise NotApplicable(f"the serving patterns ({', '.join(serving)}; docs/serving.md): a llama_batch holds "
                            "runs of tokens per sequence id, each id one recurrent-memory cell of the context, with no "
                            "padding id (slot -1) and no per-token states kept for a speculative commit; this adapter "
                            "does not map pools of slots onto sequence ids")
    if is_strict(program):
        raise NotApplicable("strict mode (raise seq_pos_mismatch instead of resetting) is not a llama.cpp feature: an "
                            "embeddings batch of an M-RoPE model (qwen35) may start at any position after the one its "
                            "memory holds, and llama_decode accepts it without an error")
    try:
        GDNConfig.from_hf(dict(config))
    except GDNError as exc:
        raise NotApplicable(
            f"llama.cpp's converter and loader are not asked this configuration ({exc.code}: {exc}): "
            "convert_hf_to_gguf.py reads the keys through transformers' AutoConfig (which fills a missing head setting "
            "with its default) and checks none of the rest; what it lets through reaches GGML_ASSERTs in the graph "
            "(H_v % H_k, S_k == S_v), which abort the process instead of refusing") from None


def _check_expressible(cfg: GDNConfig, weights) -> None:
    if cfg.head_k_dim != cfg.head_v_dim:
        graph = "qwen35moe" if cfg.mlp_kind(0) == "moe" else "qwen35"
        raise NotApplicable(f"dk != dv ({cfg.head_k_dim} != {cfg.head_v_dim}): llama.cpp's {graph} graph takes "
                            "both head dims from ssm_d_state and ggml_gated_delta_net asserts S_k == S_v (its state is "
                            "[S_v, S_v, H_v])")
    if cfg.mlp_kind(0) == "moe" and not cfg.norm_topk_prob:
        raise NotApplicable("norm_topk_prob=false (routing weights not renormalised): llama.cpp's qwen35moe graph "
                            "calls build_moe_ffn with norm_w = true whatever the model (build_layer_ffn), and its "
                            "converter writes no key for the option")
    norm = weights.get("linear_attn.norm.weight")
    if norm is not None:
        size = int(np.size(norm))
        if size == cfg.value_dim and cfg.value_dim != cfg.head_v_dim:
            raise NotApplicable(f"per_head gated norm ({size} = Hv·dv weights): llama.cpp's ssm_norm is one "
                                f"[head_v_dim = {cfg.head_v_dim}] weight shared by every head")
        if cfg.norm_mode is not None and not (cfg.norm_mode == "shared" and size == cfg.head_v_dim):
            raise NotApplicable(f"the config declares linear_norm_mode={cfg.norm_mode!r}, a setting llama.cpp's "
                                "converter neither reads nor checks")


def llamacpp(cfg: GDNConfig, weights, *, profile: str = "f32", strict: bool = False, **options) -> LlamaCppLayer:
    """The plug-in factory of implementation ``llamacpp``. Options: ``source`` (the unpacked llama-cpp-python
    sdist the library was built from), ``threads`` (llama.cpp's thread count, default 1)."""
    unknown = sorted(set(options) - {"source", "threads"})
    if unknown:
        raise GDNError(f"llamacpp: unknown option(s) {', '.join(unknown)}; it takes source, threads")
    if profile not in PROFILES:
        raise GDNError(f"implementation 'llamacpp' runs in profile {', '.join(PROFILES)}, found {profile!r}")
    if strict:
        raise NotApplicable("strict mode is not a llama.cpp feature (an M-RoPE embeddings batch may jump positions)")
    eng = engine(options.get("source"))
    _check_expressible(cfg, weights)
    return LlamaCppLayer(eng, cfg, weights, profile, threads=int(options.get("threads", 1)))


llamacpp.check_case = check_case
llamacpp.options = ["source", "threads"]


# --- checkpoint and conversion --------------------------------------------------------------------------
#: the full-attention block 1 (see :func:`write_checkpoint`): Qwen3.5's own head shape, so that llama.cpp's
#: default M-RoPE sections ([11, 11, 10] of a 64-dim rotary part) fit it
ATTN_HEADS, ATTN_HEAD_DIM = 1, 256
#: the converter's model class (``ModelBase.register``) of a dense and a sparse checkpoint
ARCHITECTURES = {False: "Qwen3_5ForCausalLM", True: "Qwen3_5MoeForCausalLM"}


def write_checkpoint(directory: Path, cfg: GDNConfig, weights, profile: str) -> Path:
    """The layer as block 0 of a two-block ``Qwen3_5ForCausalLM`` (``Qwen3_5MoeForCausalLM``) checkpoint
    (gdncheck's own writer), with the tiny embedding and final norm a causal LM carries besides its layers.

    Block 1 is a full-attention block of zero weights whose output is never read: llama.cpp 0.3.36 aborts
    (``GGML_ASSERT(buffer)`` in ``llama_kv_cache::set_input_k_idxs``) at the first ``llama_decode`` of a
    qwen35 model whose every block is linear attention (its hybrid memory's KV cache then has no layer and
    its index inputs no buffer); no released Qwen3.5 has such a stack."""
    from gdncheck.safetensors_io import write_safetensors
    from gdncheck.synthetic import write_hf_checkpoint

    arrays = {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()}
    D, inter = cfg.hidden_size, arrays["mlp.gate_proj.weight"].shape[0] if "mlp.gate_proj.weight" in arrays else 8
    hd, nh = ATTN_HEAD_DIM, ATTN_HEADS
    zeros = {"self_attn.q_proj.weight": (2 * nh * hd, D), "self_attn.k_proj.weight": (nh * hd, D),
             "self_attn.v_proj.weight": (nh * hd, D), "self_attn.o_proj.weight": (D, nh * hd),
             "self_attn.q_norm.weight": (hd,), "self_attn.k_norm.weight": (hd,), "input_layernorm.weight": (D,),
             "post_attention_layernorm.weight": (D,), "mlp.gate_proj.weight": (inter, D),
             "mlp.up_proj.weight": (inter, D), "mlp.down_proj.weight": (D, inter)}
    sparse = cfg.mlp_kind(0) == "moe"
    if sparse:  # qwen35moe loads the sparse block in every block (load_block_trunk): block 1's too, zeros
        for name in ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"):
            del zeros[name]
        zeros.update(moe_expected_shapes(cfg))
    attn = {name: np.zeros(shape, dtype=np.float32) for name, shape in zeros.items()}
    if sparse:
        arrays, attn = checkpoint_experts(cfg, arrays), checkpoint_experts(cfg, attn)
    kind = "F32" if profile == "f32" else "BF16"
    dtypes = {name: kind for name in [*arrays, *attn]}
    if profile != "f32":
        dtypes.update({"linear_attn.A_log": "F32", "linear_attn.norm.weight": "F32"})
    extra = {"architectures": [ARCHITECTURES[sparse]], "vocab_size": VOCAB, "tie_word_embeddings": True,
             "layer_types": ["linear_attention", "full_attention"], "num_attention_heads": nh,
             "num_key_value_heads": nh, "head_dim": hd, "max_position_embeddings": 65536,
             "full_attention_interval": 2, "hidden_act": "silu",
             "torch_dtype": "float32" if profile == "f32" else "bfloat16"}
    write_hf_checkpoint(directory, cfg, {0: arrays, 1: attn}, num_layers=2, prefix="model.layers.{i}.",
                        dtypes=dtypes, extra_config=extra, expert_layout="stacked")  # experts: checkpoint_experts
    rng = np.random.default_rng(0)
    embed = (rng.standard_normal((VOCAB, D)) * 0.02).astype(np.float32)
    embed = (embed.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)  # exact in bf16
    write_safetensors(directory / "model-extra.safetensors",
                      {"model.embed_tokens.weight": embed, "model.norm.weight": np.zeros(D, dtype=np.float32)},
                      {"format": "pt"}, dtypes={"model.embed_tokens.weight": kind, "model.norm.weight": kind})
    return directory


def checkpoint_experts(cfg: GDNConfig, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A sparse block's stacked experts as a checkpoint stores them, one by one (``mlp.experts.{e}.gate_proj``,
    ``up_proj``, ``down_proj``: gdncheck's :func:`~gdncheck.experts.unstack_experts`), which the converter stacks
    again (``Qwen2MoeModel.modify_tensors``). A stacked ``gate_up_proj`` of another shape than ``[E, 2·I_moe, D]``
    (a weight error) is left stacked: the converter splits it in halves itself and llama.cpp's loader names the
    shape it finds."""
    gate_up, down = arrays.get(EXPERTS_GATE_UP), arrays.get(EXPERTS_DOWN)
    if gate_up is None or down is None or gate_up.ndim != 3 or gate_up.shape[1] != 2 * cfg.moe_intermediate_size:
        return arrays
    return unstack_experts(cfg, arrays)


_CONVERTER: Any = None


def _converter(eng: Engine):
    """llama.cpp's convert_hf_to_gguf module, imported from the vendored sources with their own gguf-py."""
    global _CONVERTER
    if _CONVERTER is not None:
        return _CONVERTER
    root = eng.source
    gguf_py = str(root / "gguf-py")
    loaded = sys.modules.get("gguf")
    if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(gguf_py):
        raise GDNError(f"implementation 'llamacpp' needs the gguf-py vendored in {root}, but another gguf is already "
                       f"imported ({getattr(loaded, '__file__', '?')})")
    for p in (gguf_py, str(root)):
        if p not in sys.path:
            sys.path.insert(0, p)
    spec = importlib.util.spec_from_file_location("gdncheck_llamacpp_convert_hf_to_gguf",
                                                  root / "convert_hf_to_gguf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _CONVERTER = module
    return module


def _tiny_vocab(self) -> None:
    """The converter's own ``_set_vocab_none`` and a vocabulary size: llama.cpp adds that many dummy tokens."""
    self._set_vocab_none()
    self.gguf_writer.add_vocab_size(VOCAB)


@contextlib.contextmanager
def _quiet_logging():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    loggers = [logging.getLogger(name) for name in ("hf-to-gguf", "gguf", "gguf.gguf_writer")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # the writer's tqdm progress bar
            yield
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def convert(eng: Engine, checkpoint: Path, out: Path, profile: str, sparse: bool = False) -> Path:
    """``convert_hf_to_gguf.py CHECKPOINT --outfile OUT --outtype f32|bf16 --no-mtp``, in this process."""
    module = _converter(eng)
    cls = module.get_model_class(ARCHITECTURES[sparse])
    argv = ["convert_hf_to_gguf.py", str(checkpoint), "--outfile", str(out), "--outtype", PROFILES[profile],
            "--no-mtp"]
    saved_argv, saved_vocab = sys.argv, cls.__dict__.get("set_vocab")
    with _LOCK, _quiet_logging():
        sys.argv = argv
        cls.set_vocab = _tiny_vocab
        try:
            module.main()
        except SystemExit as exc:
            raise LlamaCppRefused("weight_error", f"llama.cpp's convert_hf_to_gguf.py exited {exc.code}") from None
        except Exception as exc:  # noqa: BLE001 - whatever the converter raises is its refusal
            msg = f"{type(exc).__name__}: {exc}"
            raise LlamaCppRefused(refusal_code(msg), f"llama.cpp's convert_hf_to_gguf.py refused the checkpoint: "
                                                     f"{msg}") from None
        finally:
            sys.argv = saved_argv
            if saved_vocab is None:
                del cls.set_vocab
            else:
                cls.set_vocab = saved_vocab
    return out


_GGUF_TO_HF = {"ssm_norm": "linear_attn.norm.weight", "attn_qkv": "linear_attn.in_proj_qkv.weight",
               "attn_gate": "linear_attn.in_proj_z.weight", "ssm_conv1d": "linear_attn.conv1d.weight",
               "ssm_alpha": "linear_attn.in_proj_a.weight", "ssm_beta": "linear_attn.in_proj_b.weight",
               "ssm_out": "linear_attn.out_proj.weight", "ssm_a": "linear_attn.A_log",
               "ssm_dt": "linear_attn.dt_bias", "attn_norm": "input_layernorm.weight",
               "post_attention_norm": "post_attention_layernorm.weight", "ffn_gate": "mlp.gate_proj.weight",
               "ffn_up": "mlp.up_proj.weight", "ffn_down": "mlp.down_proj.weight"}
_WRONG_SHAPE = re.compile(r"tensor '([\w.]+)' has wrong shape; expected\s+([\d, ]+), got\s+([\d, ]+)")
_MISSING = re.compile(r"missing tensor '([\w.]+)'|tensor '([\w.]+)' not found")


def refusal_code(message: str) -> str:
    """The FORMAT.md §6 code of a llama.cpp refusal, from the tensor its loader (or converter) names."""
    m = _MISSING.search(message)
    if m:
        return "missing_weight"
    m = _WRONG_SHAPE.search(message)
    if m:
        name = m.group(1)
        want = [int(v) for v in m.group(2).split(",") if v.strip()]
        found = [int(v) for v in m.group(3).split(",") if v.strip()]
        while len(found) > len(want) and found[-1] == 1:  # ggml prints all four dims
            found.pop()
        if ".ssm_norm." in name:
            return "norm_weight_size"
        if ".ssm_conv1d." in name:  # ggml [K, conv_dim]
            return "conv_kernel_mismatch" if want[1:] == found[1:] and want[:1] != found[:1] else "projection_size"
        if ".attn_qkv." in name:
            return "projection_size"
        return "weight_shape"
    if "shape" in message or "size" in message:
        return "weight_error"
    return "weight_error"


# --- layouts ----------------------------------------------------------------------------------------------
def heads_to_hf(arr: np.ndarray, axis: int, num_k_heads: int, num_v_heads: int) -> np.ndarray:
    """A per-value-head axis in llama.cpp's tiled order (head ``n = j·Hk + g``: the j-th head of key group g) as
    Qwen3.5's grouped order (``o = g·r + j``), r = Hv/Hk: the inverse of the converter's ``_reorder_v_heads``."""
    r = num_v_heads // num_k_heads
    idx = np.arange(num_v_heads).reshape(r, num_k_heads).T.reshape(-1)  # idx[o] = n
    return np.take(arr, idx, axis=axis)


def recurrent_to_format(S: np.ndarray) -> np.ndarray:
    """llama.cpp's ``[B, Hv, dv, dk]`` recurrent state (ggml ``[S_k, S_v, H_v, n_seqs]``) as §5's
    ``[B, Hv, dk, dv]``."""
    return np.swapaxes(S, -1, -2)


def channels_to_hf(arr: np.ndarray, axis: int, cfg: GDNConfig) -> np.ndarray:
    """The conv channels ``[Q | K | V]`` with V's heads in llama.cpp's tiled order, as Qwen3.5's."""
    arr = np.moveaxis(arr, axis, -1)
    qk, v = arr[..., : 2 * cfg.key_dim], arr[..., 2 * cfg.key_dim:]
    v = v.reshape(*v.shape[:-1], cfg.num_v_heads, cfg.head_v_dim)
    v = heads_to_hf(v, -2, cfg.num_k_heads, cfg.num_v_heads).reshape(*qk.shape[:-1], cfg.value_dim)
    return np.moveaxis(np.concatenate([qk, v], axis=-1), -1, axis)


def moe_to_format(got: Mapping[str, np.ndarray], B: int, T: int, cfg: GDNConfig) -> dict[str, np.ndarray]:
    """The sparse block's tensors (ggml ``[n_expert | n_expert_used | n_embd, n_tokens]``, reversed: one row per
    token of the ubatch) as §5's ``[B, T, ...]``. ``selected_experts`` are llama.cpp's ``ffn_moe_topk`` (the first
    ``n_expert_used`` of its descending argsort of the probabilities), int64; ``routing_weights`` its
    ``ffn_moe_weights_norm`` (the selected probabilities divided by their clamped sum), slot for slot."""
    E, k, D = cfg.num_experts, cfg.num_experts_per_tok, cfg.hidden_size
    return {
        "router_logits": np.asarray(got["router_logits"], dtype=np.float32).reshape(B, T, E),
        "selected_experts": np.asarray(got["selected_experts"]).reshape(B, T, k).astype(np.int64),
        "routing_weights": np.asarray(got["routing_weights"], dtype=np.float32).reshape(B, T, k),
        "experts_out": np.asarray(got["experts_out"], dtype=np.float32).reshape(B, T, D),
        "shared_out": np.asarray(got["shared_out"], dtype=np.float32).reshape(B, T, D),
    }


# --- recording ------------------------------------------------------------------------------------------
class Recorder:
    """The ``cb_eval`` callback: asks for the tensors of :data:`CAPTURED` and copies them once computed."""

    def __init__(self, eng: Engine, names: Mapping[str, str] = CAPTURED):
        self.eng, self.names = eng, names
        self.active = False
        self.raw: dict[str, list[np.ndarray]] = {}
        self.error: str | None = None
        self.callback = eng.llama.ggml_backend_sched_eval_callback(self._cb)

    def _cb(self, t, ask, user_data):
        try:
            if not self.active or not t:
                return not ask
            name = self.eng.ggml.ggml_get_name(t)
            name = name.decode("utf-8", "replace") if name else ""
            if ask:
                return name in self.names
            if name in self.names:
                self.raw.setdefault(name, []).append(self._read(t))
            return True
        except Exception as exc:  # noqa: BLE001 - never raise through C
            self.error = f"{type(exc).__name__}: {exc}"
            return True

    def _read(self, t) -> np.ndarray:
        head = _TensorHead.from_address(t)
        dtype = {_GGML_F32: np.float32, _GGML_F16: np.float16, _GGML_I32: np.int32}.get(head.type)
        if dtype is None and head.type != _GGML_BF16:
            raise TypeError(f"ggml type {head.type} not read")
        nbytes = int(self.eng.ggml.ggml_nbytes(t))
        buf = (ctypes.c_char * nbytes)()
        self.eng.ggml.ggml_backend_tensor_get(t, buf, 0, nbytes)
        raw = np.frombuffer(buf, dtype=np.uint16 if head.type == _GGML_BF16 else dtype)
        shape = tuple(int(head.ne[i]) for i in range(3, -1, -1))
        strides = tuple(int(head.nb[i]) for i in range(3, -1, -1))
        arr = np.lib.stride_tricks.as_strided(raw, shape=shape, strides=strides).copy()
        if head.type == _GGML_BF16:
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        return arr if head.type == _GGML_I32 else arr.astype(np.float32, copy=False)

    @contextlib.contextmanager
    def recording(self):
        self.raw, self.error, self.active = {}, None, True
        try:
            yield self.raw
        finally:
            self.active = False


# --- the implementation ---------------------------------------------------------------------------------
@dataclass
class LlamaState:
    """One state: the §5 arrays llama.cpp computed at the call that produced it (None: the zero state), each
    sequence's llama.cpp state bytes (``llama_state_seq_get_data``; taken when the state leaves the context),
    and the positions it holds."""

    batch: int
    conv: np.ndarray | None
    rec: np.ndarray | None
    seq_len: np.ndarray
    seq_bytes: list | None = None  # per sequence: bytes of llama_state_seq_get_data, or None (zero)
    ident: int = 0
    held: np.ndarray | None = None  # llama_memory_seq_pos_max + 1 per sequence after the last call


class LlamaCppLayer:
    """An :class:`~gdncheck.harness.Implementation` driving llama.cpp's qwen35 (or qwen35moe) graph through
    ``llama_decode``."""

    def __init__(self, eng: Engine, cfg: GDNConfig, weights, profile: str, *, threads: int = 1):
        self.eng, self.cfg, self.profile, self.threads = eng, cfg, profile, threads
        self.llama = eng.llama
        self._tmp = tempfile.TemporaryDirectory(prefix="gdncheck-llamacpp-")
        tmp = Path(self._tmp.name)
        ckpt = write_checkpoint(tmp / "hf", cfg, weights, profile)
        self.sparse = cfg.mlp_kind(0) == "moe"
        gguf = convert(eng, ckpt, tmp / "layer.gguf", profile, self.sparse)
        mparams = self.llama.llama_model_default_params()
        mparams.use_mmap = False
        mark = eng.n_logged
        model = self.llama.llama_model_load_from_file(str(gguf).encode(), mparams)
        if not model:
            msg = eng.logged_since(mark).strip()
            lines = [ln for ln in msg.splitlines() if "error" in ln.lower() or "tensor" in ln.lower()] or [msg]
            raise LlamaCppRefused(refusal_code(msg), "llama.cpp refused the model: " + " | ".join(lines[-3:]))
        self.model = model
        self.n_embd = int(self.llama.llama_model_n_embd(model))
        self.captured = {**CAPTURED, **(MOE_CAPTURED if self.sparse else {})}
        self.recorder = Recorder(eng, self.captured)
        self.ctx = None
        self.ctx_batch = 0
        self.live: int | None = None  # ident of the state whose memory the context holds
        self._next = 1
        arch = "qwen35moe" if self.sparse else "qwen35"
        self.name = (f"llama.cpp (llama-cpp-python {eng.version}) {arch} via llama_decode ({profile} GGUF, CPU, "
                     f"{threads} thread{'s' if threads != 1 else ''})")

    def __del__(self):
        with contextlib.suppress(Exception):
            if self.ctx:
                self.llama.llama_free(self.ctx)
            if getattr(self, "model", None):
                self.llama.llama_model_free(self.model)

    # --- the context ---------------------------------------------------------------------------------------
    def _context(self, batch: int):
        if self.ctx is not None and self.ctx_batch == batch:
            return self.ctx
        if self.ctx is not None:
            self.llama.llama_free(self.ctx)
            self.ctx = None
        p = self.llama.llama_context_default_params()
        p.n_ctx = 8192 * batch  # per sequence 8192 positions (the attention block's KV cache)
        p.n_batch = MAX_UBATCH
        p.n_ubatch = MAX_UBATCH
        p.n_seq_max = batch
        p.n_threads = self.threads
        p.n_threads_batch = self.threads
        p.embeddings = False
        p.cb_eval = self.recorder.callback
        p.cb_eval_user_data = None
        ctx = self.llama.llama_init_from_model(self.model, p)
        if not ctx:
            raise GDNError("llama.cpp: llama_init_from_model failed: " + "".join(self.eng.log_lines[-5:]).strip())
        self.ctx, self.ctx_batch, self.live = ctx, batch, None
        return ctx

    def _mem(self):
        return self.llama.llama_get_memory(self.ctx)

    def _take_out(self, state: LlamaState) -> None:
        """The context's memory of ``state``'s sequences as llama.cpp's own bytes (before another state enters)."""
        out = []
        for b in range(state.batch):
            n = int(self.llama.llama_state_seq_get_size(self.ctx, b))
            buf = (ctypes.c_uint8 * n)()
            got = int(self.llama.llama_state_seq_get_data(self.ctx, buf, n, b))
            out.append(bytes(buf[:got]))
        state.seq_bytes = out

    def _bring_in(self, state: LlamaState) -> None:
        ctx = self._context(state.batch)
        if self.live == state.ident:
            return
        self.llama.llama_memory_clear(self._mem(), True)
        for b, data in enumerate(state.seq_bytes or []):
            if data is None or not np.any(state.seq_len[b] > 0):
                continue
            buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
            if not self.llama.llama_state_seq_set_data(ctx, buf, len(data), b):
                raise GDNError(f"llama.cpp: llama_state_seq_set_data failed for sequence {b}")
        self.live = state.ident

    # --- state -------------------------------------------------------------------------------------------
    def new_state(self, batch: int) -> LlamaState:
        self._context(batch)
        state = LlamaState(batch, None, None, np.zeros(batch, dtype=np.int64), None, self._next)
        self._next += 1
        return state

    def state_arrays(self, state: LlamaState) -> dict[str, Any]:
        cfg, B = self.cfg, state.batch
        conv = state.conv if state.conv is not None else \
            np.zeros((B, cfg.conv_dim, cfg.conv_kernel), dtype=np.float32)
        rec = state.rec if state.rec is not None else \
            np.zeros((B, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim), dtype=np.float32)
        out = {"conv_state": conv, "recurrent_state": rec}
        if state.held is not None:
            out["seq_len"] = state.held.copy()
        return out

    def snapshot(self, state: LlamaState) -> LlamaState:
        if self.live == state.ident and self.ctx is not None:
            self._take_out(state)
        snap = LlamaState(state.batch, state.conv, state.rec, state.seq_len.copy(),
                          list(state.seq_bytes) if state.seq_bytes is not None else None, self._next, state.held)
        self._next += 1
        return snap

    def restore(self, state: LlamaState, snap: LlamaState) -> None:
        state.conv, state.rec, state.seq_len, state.held = snap.conv, snap.rec, snap.seq_len.copy(), snap.held
        state.seq_bytes = list(snap.seq_bytes) if snap.seq_bytes is not None else None
        if self.live == state.ident:
            self.live = None  # the context no longer holds it: brought in again at the next call
        state.batch = snap.batch

    def save_snapshot(self, snap: LlamaState, path: str) -> None:
        raise NotApplicable("snapshot files: llama.cpp's llama_state_seq_save_file writes its own session format "
                            "(token list and serialised memory cells), not the snapshot file of FORMAT.md §7")

    def load_snapshot(self, path: str) -> LlamaState:
        raise NotApplicable("snapshot files: llama.cpp's llama_state_seq_load_file reads its own session format, "
                            "not FORMAT.md §7's")

    # --- forward -----------------------------------------------------------------------------------------
    def forward(self, x: np.ndarray, state: LlamaState, seq_pos: np.ndarray):
        x = np.asarray(x)
        if not np.issubdtype(x.dtype, np.floating):
            raise LlamaCppRefused("input_dtype", f"llama_batch.embd is a float * (n_embd floats per token): an x of "
                                                 f"dtype {x.dtype} is no such buffer")
        if x.ndim != 3 or x.shape[0] != state.batch or x.shape[1] < 1 or x.shape[2] != self.n_embd:
            raise LlamaCppRefused("input_shape", f"llama_batch.embd holds n_embd = {self.n_embd} floats per token "
                                                 f"(llama_model_n_embd) for each of {state.batch} sequences: an x of "
                                                 f"shape {list(x.shape)} is no such buffer")
        seq_pos = np.asarray(seq_pos, dtype=np.int64)
        self._bring_in(state)
        moved = np.flatnonzero(state.seq_len != seq_pos)
        for b in moved:  # the seq-len rule: llama.cpp's own removal of the sequence's memory
            self.llama.llama_memory_seq_rm(self._mem(), int(b), -1, -1)
        B, T = int(x.shape[0]), int(x.shape[1])
        step = max(1, MAX_UBATCH // B)
        pieces = []
        for t0 in range(0, T, step):
            pieces.append(self._decode(np.ascontiguousarray(x[:, t0:t0 + step], dtype=np.float32), seq_pos + t0))
        state.seq_len = seq_pos + T
        trace = {k: np.concatenate([p[k] for p in pieces], axis=1) for k in pieces[0] if k not in
                 ("conv_state", "recurrent_state")}
        state.conv = pieces[-1]["conv_state"]
        state.rec = pieces[-1]["recurrent_state"]
        state.seq_bytes = None
        mem = self._mem()  # the positions llama.cpp's memory holds: its own sequence lengths
        state.held = np.array([int(self.llama.llama_memory_seq_pos_max(mem, b)) + 1 for b in range(B)], dtype=np.int64)
        return trace.pop("out"), trace

    def _decode(self, x: np.ndarray, pos0: np.ndarray) -> dict[str, np.ndarray]:
        llama, B, T, D = self.llama, x.shape[0], x.shape[1], x.shape[2]
        n = B * T
        embd = np.ascontiguousarray(x.reshape(n, D), dtype=np.float32)
        tok_pos = (pos0[:, None] + np.arange(T)[None, :]).reshape(n).astype(np.int32)
        pos = np.ascontiguousarray(np.tile(tok_pos, self.eng.n_pos_per_embd), dtype=np.int32)  # section-major
        n_seq_id = np.ones(n, dtype=np.int32)
        seq_ids = [(ctypes.c_int32 * 1)(b) for b in range(B) for _ in range(T)]
        seq_ptrs = (ctypes.POINTER(ctypes.c_int32) * n)(*[ctypes.cast(s, ctypes.POINTER(ctypes.c_int32))
                                                          for s in seq_ids])
        logits = np.ones(n, dtype=np.int8)
        batch = llama.llama_batch()
        batch.n_tokens = n
        batch.token = None
        batch.embd = embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        batch.pos = pos.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.n_seq_id = n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.seq_id = seq_ptrs
        batch.logits = logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        mark = self.eng.n_logged
        with self.recorder.recording() as raw:
            rc = int(llama.llama_decode(self.ctx, batch))
        if rc != 0:
            msg = self.eng.logged_since(mark).strip()
            raise LlamaCppRefused("input_error", f"llama_decode returned {rc}: {msg[-400:]}")
        if self.recorder.error:
            raise GDNError(f"llamacpp: reading llama.cpp's tensors failed: {self.recorder.error}")
        missing = [k for k in self.captured if k not in raw and k not in OPTIONAL]
        if missing:
            raise GDNError(f"llamacpp: llama.cpp's graph named no {', '.join(missing)} (another llama.cpp graph?)")
        if any(len(v) != 1 for k, v in raw.items() if k in ("l_out-0", "new_state-0")):
            raise GDNError("llamacpp: llama_decode split the call into several ubatches")
        got = {self.captured[k]: v[-1] for k, v in raw.items()}
        return self._to_format(got, x)

    def _to_format(self, got: dict[str, np.ndarray], x: np.ndarray) -> dict[str, np.ndarray]:
        cfg = self.cfg
        B, T, D = x.shape
        Hk, Hv, dk, dv, K = cfg.num_k_heads, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim, cfg.conv_kernel

        def tokens(a, *tail):  # ggml [..., n_seq_tokens, n_seqs] (reversed: [n_seqs, n_seq_tokens, ...])
            return np.asarray(a, dtype=np.float32).reshape(B, T, *tail)

        def heads(a, axis=2):
            return heads_to_hf(a, axis, Hk, Hv)

        if "input" in got and not np.array_equal(tokens(got["input"], D), x.astype(np.float32)):
            raise GDNError("llamacpp: llama.cpp's model.input_embed is not x in the batch's order (ubatch reordered?)")
        out = {name: tokens(got[name], D) for name in ("x_norm", "attn_out", "h", "h_norm", "mlp_out", "out")}
        out["qkv"] = channels_to_hf(tokens(got["qkv"], cfg.conv_dim), 2, cfg)
        out["z"] = heads(tokens(got["z"], Hv, dv))
        out["a"] = heads(tokens(got["a"], Hv))
        out["b"] = heads(tokens(got["b"], Hv))
        qkv_conv = channels_to_hf(tokens(got["qkv_conv"], cfg.conv_dim), 2, cfg)
        out["qkv_conv"] = qkv_conv
        out["q"] = tokens(got["q"], Hk, dk)
        out["k"] = tokens(got["k"], Hk, dk)
        out["v"] = qkv_conv[..., 2 * cfg.key_dim:].reshape(B, T, Hv, dv)
        out["g"] = heads(tokens(got["g"], Hv))
        out["beta"] = heads(tokens(got["beta"], Hv))
        out["core"] = heads(tokens(got["core"], Hv, dv))
        out["core_gated"] = heads(tokens(got["core_gated"], Hv, dv))
        S = np.asarray(got["recurrent_state"], dtype=np.float32).reshape(B, Hv, dv, dk)
        out["recurrent_state"] = np.ascontiguousarray(heads(recurrent_to_format(S), 1))
        window = np.asarray(got["conv_window"], dtype=np.float32).reshape(B, cfg.conv_dim, K - 1 + T)
        out["conv_state"] = np.ascontiguousarray(channels_to_hf(window[:, :, -K:], 1, cfg))
        if self.sparse:
            out.update(moe_to_format(got, B, T, cfg))
        return out


__all__ = ["ARCHITECTURES", "CAPTURED", "MOE_CAPTURED", "NOT_INSTALLED", "TESTED", "LlamaCppLayer", "LlamaCppRefused",
           "channels_to_hf", "check_case", "checkpoint_experts", "convert", "engine", "heads_to_hf", "llamacpp",
           "moe_to_format", "recurrent_to_format", "refusal_code", "write_checkpoint"]
