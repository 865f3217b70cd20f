"""Hugging Face transformers as a port: `gdncheck run hf --profile f32|bf16`.

A factory of the port contract (`gdncheck.harness.contract`) around transformers' own
`Qwen3_5DecoderLayer` (`Qwen3_5MoeDecoderLayer` where the weights hold the sparse block), driven
through its own `forward` and a `DynamicCache`, so transformers picks its own code paths. The stage
tensors are what transformers computes (`.hf_trace`), only reshaped. What it cannot express (a
per-head norm, the seq-len rule, strict mode, snapshot files, ...) is `NotApplicable` with the
reason; on an exact top-k tie its CPU router is a known deviation. Its parameters are all held in the
profile's dtype, as ``from_pretrained(dtype=...)`` holds them: in bf16 the checkpoint's float32 ``A_log``
and gated-norm weight are rounded to bf16, as transformers does (no ``_keep_in_fp32_modules`` on Qwen3.5).

Design and the full list: docs/ports.md §2.
"""

from __future__ import annotations

import copy
import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.conformance.engines.hf.trace import Tracer
from gdncheck.env import blas_threads
from gdncheck.errors import GDNError
from gdncheck.harness import NotApplicable, is_strict, serving_ops
from gdncheck.profiles import PROFILES, VERIFY_PROFILES


class TransformersRefused(Exception):  # noqa: N818 - carries the code of what transformers refused
    """transformers raised; ``code`` is the FORMAT.md §6 code it stands for."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def _torch_dtype(profile: str):
    import torch  # the hf extra: only an hf run needs it

    return getattr(torch, PROFILES[profile].torch_dtype)


def check_case(config: Mapping[str, Any], program: list[Mapping[str, Any]]) -> None:
    """Called before gdncheck parses the config: what transformers cannot be asked at all."""
    serving = serving_ops(program)
    if serving:
        raise NotApplicable(f"the serving patterns ({', '.join(serving)}; docs/serving.md) are not a transformers "
                            "feature: Qwen3_5DecoderLayer takes [B, T, D] batches with one cache row per batch row "
                            "(no packed cu_seqlens stream, no slot indices into a state pool, no per-token states "
                            "kept for a speculative commit)")
    if is_strict(program):
        raise NotApplicable("strict mode (raise seq_pos_mismatch instead of resetting) is not a transformers "
                            "feature: its linear-attention cache keeps no sequence position")
    try:
        GDNConfig.from_hf(dict(config))
    except GDNError as exc:
        name = "Qwen3_5MoeTextConfig" if config.get("num_experts") is not None else "Qwen3_5TextConfig"
        raise NotApplicable(
            f"transformers' {name} accepts this configuration without a check ({exc.code}: {exc}); "
            "only gdncheck's own parser refuses it, which says nothing about transformers"
            + (" (a missing linear_num_value_heads silently takes its default, 32)" if exc.code ==
               "missing_head_setting" else "")
        ) from None


def hf(cfg: GDNConfig, weights, *, profile: str = "f32", strict: bool = False, **options) -> HFLayer:
    """The plug-in factory of implementation ``hf``."""
    if options:
        raise GDNError(f"hf: unknown option(s) {', '.join(sorted(options))}; it takes none")
    if profile not in VERIFY_PROFILES:  # no f64: transformers' delta rules cast their inputs to float32
        raise GDNError(f"implementation 'hf' runs in profile {', '.join(VERIFY_PROFILES)}, found {profile!r} "
                       "(transformers computes its delta rule in float32 whatever the dtype)")
    if strict:  # check_case refuses strict programs first; a direct caller gets the same answer
        raise NotApplicable("strict mode is not a transformers feature")
    if importlib.util.find_spec("transformers") is None:
        raise GDNError("implementation 'hf' needs transformers, which is not installed here: "
                       "pip install 'gdncheck[hf]' (or pip install transformers)")
    _check_expressible(cfg, weights)
    return HFLayer(cfg, weights, profile)


hf.check_case = check_case


def _check_expressible(cfg: GDNConfig, weights) -> None:
    if cfg.mlp_kind(0) == "moe" and not cfg.norm_topk_prob:
        raise NotApplicable("norm_topk_prob=false (routing weights not renormalised): transformers' "
                            "Qwen3_5MoeSparseMoeBlock always renormalises, and Qwen3NextSparseMoeBlock, which need "
                            "not, sits in a decoder layer whose linear attention holds another weight layout "
                            "(in_proj_qkvz, in_proj_ba)")
    norm = weights.get("linear_attn.norm.weight")
    if norm is None:
        return  # transformers' load_state_dict reports it
    size = int(np.size(norm))
    if size == cfg.value_dim and cfg.value_dim != cfg.head_v_dim:
        raise NotApplicable(f"per_head gated norm ({size} = Hv·dv weights): transformers' Qwen3_5RMSNormGated "
                            f"has one [dv = {cfg.head_v_dim}] weight shared by every head")
    if cfg.norm_mode is not None:
        inferred = "shared" if size == cfg.head_v_dim else None
        if inferred != cfg.norm_mode:
            raise NotApplicable(f"the config declares linear_norm_mode={cfg.norm_mode!r}, a setting transformers "
                                "does not have (it neither reads nor checks it)")


_SIZE_MISMATCH = re.compile(r"size mismatch for ([\w.]+): copying a param with shape torch\.Size\(\[([\d, ]*)\]\) "
                            r"from checkpoint, the shape in current model is torch\.Size\(\[([\d, ]*)\]\)")


def refusal_code(message: str) -> str:
    """The FORMAT.md §6 code of a ``load_state_dict`` refusal, from the tensor transformers names."""
    if "Missing key(s)" in message:
        return "missing_weight"
    m = _SIZE_MISMATCH.search(message)
    if not m:
        return "weight_error"
    name = m.group(1)
    found = [int(v) for v in m.group(2).split(",") if v.strip()]
    want = [int(v) for v in m.group(3).split(",") if v.strip()]
    if name == "linear_attn.norm.weight":
        return "norm_weight_size"
    if name == "linear_attn.conv1d.weight" and found[:-1] == want[:-1]:
        return "conv_kernel_mismatch"
    if name in ("linear_attn.in_proj_qkv.weight", "linear_attn.conv1d.weight"):
        return "projection_size"
    return "weight_shape"


@dataclass
class HFState:
    """A transformers cache for ``batch`` sequences, and the positions the adapter has fed it (to tell
    when a call asks for the seq-len rule, which transformers does not have)."""

    cache: Any  # transformers.cache_utils.DynamicCache
    seq_len: np.ndarray


class HFLayer:
    """An :class:`~gdncheck.harness.Implementation` driving transformers' ``Qwen3_5DecoderLayer`` (or
    ``Qwen3_5MoeDecoderLayer``, for weights with the sparse block)."""

    def __init__(self, cfg: GDNConfig, weights, profile: str):
        import torch
        import transformers

        transformers.logging.set_verbosity_error()  # its "falling back to the PyTorch implementation" notes
        # gdncheck's BLAS thread count (GDN_BLAS_THREADS, default 1): on a 2-core machine two torch threads
        # made the whole suite 4-15x slower (small matmuls stall), as two OpenBLAS threads do
        if torch.get_num_threads() != blas_threads():
            torch.set_num_threads(blas_threads())
        self.cfg, self.profile, self.dtype = cfg, profile, _torch_dtype(profile)
        self.sparse = cfg.mlp_kind(0) == "moe"  # the config says, not the weights (a router may be missing)
        modeling, config_class, layer_class, sizes = self._classes(cfg)
        self.hf_config = config_class(
            hidden_size=cfg.hidden_size, rms_norm_eps=cfg.rms_norm_eps,
            linear_num_key_heads=cfg.num_k_heads, linear_num_value_heads=cfg.num_v_heads,
            linear_key_head_dim=cfg.head_k_dim, linear_value_head_dim=cfg.head_v_dim,
            linear_conv_kernel_dim=cfg.conv_kernel, hidden_act="silu",
            num_hidden_layers=1, layer_types=["linear_attention"], vocab_size=16, **sizes,
        )
        with torch.device("cpu"):
            layer = layer_class(self.hf_config, layer_idx=0)
        state = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in weights.items()}
        try:
            layer.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            msg = str(exc)
            raise TransformersRefused(refusal_code(msg), f"transformers refused the weights: {msg}") from None
        # every parameter in the profile's dtype, A_log and the gated norm's weight too, as transformers loads a
        # checkpoint: its Qwen3.5 classes set no _keep_in_fp32_modules, so from_pretrained(dtype=torch.bfloat16) (or
        # dtype="auto", the config's bfloat16) rounds the checkpoint's float32 A_log and linear_attn.norm.weight to
        # bf16 (transformers/core_model_loading.py, the requested dtype unless a keep-in-fp32 pattern matches;
        # measured on 5.24: A_log -2.3456789 loads as -2.34375). In f32 they stay the case file's float32 values.
        # That rounding is below what the bf16 profile resolves (fixtures/FORMAT.md §3, docs/meta.md)
        self.layer = layer.to(self.dtype).eval()
        self.tracer = Tracer(self.layer, modeling, cfg, sparse=self.sparse)
        kernels = [m for m in ("causal_conv1d", "kernels") if importlib.util.find_spec(m) is not None]
        # fla's delta-rule kernels are bypassed on the CPU (hf_trace: transformers' own PyTorch rule)
        self.name = (f"transformers {transformers.__version__} {layer_class.__name__} ({profile}, torch "
                     f"{torch.__version__}, {'kernels: ' + ', '.join(kernels) if kernels else 'PyTorch paths'})")

    def _classes(self, cfg: GDNConfig):
        """(modeling module, config class, decoder layer class, size keys) of the layer's kind: the
        dense ``Qwen3_5DecoderLayer``, or ``Qwen3_5MoeDecoderLayer`` for the sparse block (its experts
        run by transformers' eager loop, the default of a model it loads itself)."""
        if not self.sparse:
            from transformers.models.qwen3_5 import modeling_qwen3_5
            from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig

            return (modeling_qwen3_5, Qwen3_5TextConfig, modeling_qwen3_5.Qwen3_5DecoderLayer,
                    {"intermediate_size": cfg.intermediate_size})
        from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe
        from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig

        return (modeling_qwen3_5_moe, Qwen3_5MoeTextConfig, modeling_qwen3_5_moe.Qwen3_5MoeDecoderLayer,
                {"num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
                 "moe_intermediate_size": cfg.moe_intermediate_size,
                 "shared_expert_intermediate_size": cfg.shared_expert_intermediate_size,
                 "experts_implementation": "eager"})

    # --- state -----------------------------------------------------------------------------------
    def new_state(self, batch: int) -> HFState:
        from transformers.cache_utils import DynamicCache

        return HFState(DynamicCache(config=self.hf_config), np.zeros(batch, dtype=np.int64))

    def _cache_layer(self, state: HFState):
        return state.cache.layers[0]

    def state_arrays(self, state: HFState) -> dict[str, Any]:
        """The cache's own tensors; zeros (of the shapes transformers allocates) before its first call."""
        import torch

        layer, B, cfg = self._cache_layer(state), len(state.seq_len), self.cfg
        conv = layer.conv_states[0] if layer.is_conv_states_initialized[0] else \
            torch.zeros(B, cfg.conv_dim, cfg.conv_kernel, dtype=self.dtype)
        rec = layer.recurrent_states[0] if layer.is_recurrent_states_initialized[0] else \
            torch.zeros(B, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim, dtype=torch.float32)
        return {"conv_state": conv, "recurrent_state": rec}

    def snapshot(self, state: HFState) -> HFState:
        return HFState(copy.deepcopy(state.cache), state.seq_len.copy())

    def restore(self, state: HFState, snap: HFState) -> None:
        state.cache = copy.deepcopy(snap.cache)
        state.seq_len = snap.seq_len.copy()

    def save_snapshot(self, snap: HFState, path: str) -> None:
        raise NotApplicable("snapshot files: transformers has no file format for its cache (a DynamicCache is "
                            "neither saved nor loaded by transformers)")

    def load_snapshot(self, path: str) -> HFState:
        raise NotApplicable("snapshot files: transformers has no file format for its cache")

    # --- forward ---------------------------------------------------------------------------------
    def forward(self, x: np.ndarray, state: HFState, seq_pos: np.ndarray):
        import torch

        seq_pos = np.asarray(seq_pos, dtype=np.int64)
        moved = np.flatnonzero(state.seq_len != seq_pos)
        if moved.size:
            b = int(moved[0])
            raise NotApplicable(
                f"the seq-len rule: row {b} is called at position {int(seq_pos[b])} but its state holds "
                f"{int(state.seq_len[b])} tokens; docs/spec.md §4 resets that row to zeros, transformers' "
                "linear-attention cache keeps no position and resets no row")
        xt = torch.from_numpy(np.ascontiguousarray(x))
        if xt.is_floating_point():
            xt = xt.to(self.dtype)
        shape = (int(x.shape[0]), int(x.shape[1])) if x.ndim == 3 else (0, 0)
        with torch.inference_mode(), self.tracer.recording(T=shape[1], B=shape[0]) as rec:
            try:
                out = self.layer(xt, position_embeddings=None, cache=state.cache)
            except (RuntimeError, ValueError, TypeError, IndexError) as exc:
                raise TransformersRefused(
                    "input_error", f"transformers raised {type(exc).__name__} on the input of shape "
                                   f"{list(x.shape)} and dtype {x.dtype}: {exc}") from None
        state.seq_len = seq_pos + x.shape[1]
        return out, rec.trace()

    @property
    def calls(self) -> list[dict]:
        """Which transformers functions each forward called (newest last): for the tests and the curious."""
        return self.tracer.calls
