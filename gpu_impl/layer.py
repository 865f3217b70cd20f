"""The whole GDN decoder layer on the Triton path, with its state (docs/spec.md §2, §4).

One call (T tokens of B sequences) runs in the profile's activation dtype with fp32 math inside
every kernel and an fp32 recurrent state updated in place; a sparse layer
(`cfg.mlp_kind(layer_index) == "moe"`) runs `moe.moe_block` in place of the MLP. `capture=True`
returns every stage tensor of the layer's kind (`gdncheck.stages.layer_tensors`); without it the
trace is empty and each activation is freed once read. Nothing is read on the host except with
`strict=True` (the seq_pos rule runs on the device), so decode can be captured in a CUDA graph.

The kernels of a call: docs/gpu.md §10; memory §4; host synchronisation §5.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import torch

from gdncheck.calls import check_seq_pos, check_state, check_x, rows_to_reset
from gdncheck.config import GDNConfig
from gdncheck.errors import InputError, InputShapeError, LayerOptionError
from gdncheck.profiles import PROFILES, VERIFY_PROFILES
from gdncheck.stages import STAGE_TENSORS, layer_tensors
from gdncheck.weights import expected_shapes, validate_weights

from .conv1d import conv1d_qk_norm
from .delta_rule import delta_rule_recurrent
from .delta_rule_chunked import CHUNK_SIZES, delta_rule_chunked
from .gated_norm import gated_norm
from .gates import gates
from .in_proj import in_proj_stacked, stack_in_proj
from .input_norm import input_norm
from .mlp import mlp_stacked, stack_gate_up
from .moe import MoEWeights, moe_block
from .out_proj import out_proj
from .residual import output, residual_post_norm
from .state import State
from .target import resolve_device

log = logging.getLogger("gdncheck.gpu_impl")

#: The torch dtype of each profile the Triton path runs in (gdncheck/profiles.py holds the profiles).
DTYPES: dict[str, torch.dtype] = {name: getattr(torch, PROFILES[name].torch_dtype) for name in VERIFY_PROFILES}
DELTA_RULE_FORMS = ("auto", "recurrent", "chunked")

#: ``delta_rule="auto"`` runs the fused recurrent kernel up to this many tokens, else the chunked one.
RECURRENT_MAX_TOKENS = 16

#: The order of the trace's stage tensors (gdncheck.stages), per layer kind.
STAGE_ORDER = tuple(t.name for t in STAGE_TENSORS)
TRACE_ORDER = {kind: tuple(t.name for t in layer_tensors(kind)) for kind in ("dense", "moe")}

#: 1-D parameters kept in fp32 (Qwen3.5 stores A_log and the gated-norm weight as F32); every
#: matrix and the conv weight are held in the profile dtype.
FP32_PARAMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "linear_attn.norm.weight",
               "linear_attn.A_log", "linear_attn.dt_bias")


def _check_options(delta_rule, chunk_size, layer: int | None) -> None:
    """Refuse (:class:`LayerOptionError`, a ``ValueError`` too) a ``delta_rule`` none of
    :data:`DELTA_RULE_FORMS` or a ``chunk_size`` none of the chunked kernel's ``CHUNK_SIZES``; ``None``
    (the layer's own setting) passes."""
    if delta_rule is not None and (not isinstance(delta_rule, str) or delta_rule not in DELTA_RULE_FORMS):
        raise LayerOptionError(f"expected delta_rule one of {', '.join(DELTA_RULE_FORMS)}, found {delta_rule!r}",
                               layer=layer)
    if chunk_size is not None and (isinstance(chunk_size, bool) or chunk_size not in CHUNK_SIZES):
        raise LayerOptionError(f"expected chunk_size one of {', '.join(map(str, CHUNK_SIZES))}, found "
                               f"{chunk_size!r}", layer=layer)


class Layer:
    """One GDN decoder layer on the Triton path (compiled on CUDA, interpreted on the CPU).

    >>> layer = Layer(cfg, weights, profile="bf16")
    >>> state = layer.new_state(batch=2)
    >>> out, trace = layer.forward(x, state, seq_pos=0)   # x: [2, T, D]; state updated in place

    Same promises as :class:`gdncheck.reference.Layer`: seq_pos reset (warning logged once per
    state on logger ``gdncheck.gpu_impl``) or ``strict`` error, snapshots, input errors.
    """

    def __init__(
        self,
        cfg: GDNConfig,
        weights: Mapping[str, np.ndarray],
        layer_index: int | None = None,
        *,
        profile: str = "f32",
        device: str | torch.device = "auto",
        strict: bool = False,
        delta_rule: str = "auto",
        chunk_size: int = 64,
    ):
        if layer_index is None:
            layer_index = getattr(weights, "layer", None)
        self._configure(cfg, layer_index, profile, strict, delta_rule, chunk_size)
        self.norm_mode = validate_weights(cfg, weights, layer=layer_index)
        self.mlp_kind = cfg.mlp_kind(layer_index)
        self.device = resolve_device(device)

        def param(name: str) -> torch.Tensor:
            dtype = torch.float32 if name in FP32_PARAMS else self.dtype
            return torch.tensor(np.asarray(weights[name], dtype=np.float64), dtype=dtype, device=self.device)

        self._adopt({name: param(name) for name in weights})

    @classmethod
    def shaped(cls, cfg: GDNConfig, *, profile: str = "bf16", norm_mode: str = "shared", delta_rule: str = "auto",
               chunk_size: int = 64, mlp_kind: str | None = None) -> Layer:
        """A layer whose weights are tensors on torch's ``meta`` device: shapes and dtypes, no memory.

        Its calls run no kernel: inside ``compile_check`` or ``record_launches`` they make the very
        launches of a real call, at any size (the compile table, the grid and memory checks).
        ``mlp_kind``: ``dense`` or ``moe`` (default: the config's, for a config whose layers agree)."""
        layer = cls.__new__(cls)
        layer._configure(cfg, None, profile, False, delta_rule, chunk_size)
        layer.norm_mode = norm_mode
        layer.mlp_kind = mlp_kind or cfg.mlp_kind()
        layer.device = torch.device("meta")
        layer._adopt({name: torch.empty(shape, device="meta",
                                        dtype=torch.float32 if name in FP32_PARAMS else layer.dtype)
                      for name, shape in expected_shapes(cfg, norm_mode, layer.mlp_kind).items()})
        return layer

    def _configure(self, cfg, layer_index, profile, strict, delta_rule, chunk_size) -> None:
        if not isinstance(profile, str) or profile not in DTYPES:
            raise LayerOptionError(f"expected profile one of {', '.join(DTYPES)}, found {profile!r}",
                                   layer=layer_index)
        _check_options(delta_rule, chunk_size, layer_index)
        self.cfg = cfg
        self.layer_index = layer_index
        self.profile = profile
        self.dtype = DTYPES[profile]
        self.strict = strict
        self.delta_rule = delta_rule
        self.chunk_size = chunk_size

    def _adopt(self, p: dict[str, torch.Tensor]) -> None:
        """Hold the parameters in the layout the kernels read (stacked projections, 2-D conv weight)."""
        cfg = self.cfg
        self.w_in_norm = p["input_layernorm.weight"]
        self.w_in = stack_in_proj(p["linear_attn.in_proj_qkv.weight"], p["linear_attn.in_proj_z.weight"],
                                  p["linear_attn.in_proj_a.weight"], p["linear_attn.in_proj_b.weight"])
        self.w_conv = p["linear_attn.conv1d.weight"].reshape(cfg.conv_dim, cfg.conv_kernel).contiguous()
        self.A_log = p["linear_attn.A_log"]
        self.dt_bias = p["linear_attn.dt_bias"]
        self.w_norm = p["linear_attn.norm.weight"]
        self.w_out = p["linear_attn.out_proj.weight"]
        self.w_post_norm = p["post_attention_layernorm.weight"]
        if self.mlp_kind == "moe":
            self.moe = MoEWeights.from_params(p, cfg)
            return
        self.moe = None
        self.w_gate_up = stack_gate_up(p["mlp.gate_proj.weight"], p["mlp.up_proj.weight"])
        self.w_down = p["mlp.down_proj.weight"]

    def new_state(self, batch: int = 1) -> State:
        return State(self.cfg, batch, dtype=self.dtype, device=self.device)

    # --- one call ---------------------------------------------------------------------------------
    def forward(
        self,
        x,
        state: State,
        seq_pos,
        capture: bool = False,
        *,
        strict: bool | None = None,
        delta_rule: str | None = None,
        chunk_size: int | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Run T tokens of each sequence; update ``state`` in place; return ``(out, trace)``.

        x: [B, T, D] floating point (NumPy array or torch tensor; cast to the profile dtype on the
        layer's device). seq_pos: the position of the first token, an int or one per sequence (a
        list, an array, or an integer tensor, which on the layer's device is used without being
        read: decode under a CUDA graph passes ``state.seq_len`` or a static tensor); a row whose
        state ``seq_len`` differs is reset to zeros first. out: [B, T, D] in the profile dtype on
        the device; trace: {} unless ``capture``, then every stage tensor by name.
        """
        x = self._check_input(x, state)
        T = x.shape[1]
        strict = self.strict if strict is None else strict
        _check_options(delta_rule, chunk_size, self.layer_index)
        form = delta_rule or self.delta_rule
        state.flush_warnings(log, self.layer_index)
        pos = self._positions(seq_pos, state)
        if strict:  # must raise before anything changes: the one path that reads the device
            host = pos.cpu().numpy() if isinstance(pos, torch.Tensor) else np.broadcast_to(pos, (state.batch,))
            rows_to_reset(host, state.seq_len.cpu().numpy(), strict=True, warned=state.warned,
                          layer=self.layer_index, logger=log)
        reset = state.seq_len != pos
        state.queue_mismatch_report(reset, pos)
        out, trace = self._run(x, state, reset, form, chunk_size or self.chunk_size, capture)
        if isinstance(pos, torch.Tensor):
            torch.add(pos, T, out=state.seq_len)
        else:
            state.seq_len.fill_(pos + T)
        state.flush_warnings(log, self.layer_index)
        return out, trace

    def _positions(self, seq_pos, state: State):
        """seq_pos as an int (one position for every row) or an int64 tensor [B] on the device.

        Host values (int, list, array, CPU tensor) are checked (``gdncheck.calls``); positions all
        equal become an int (no copy); others are copied once, from pinned memory on CUDA. A tensor
        on the device is checked by its shape and dtype only: its values stay on the device."""
        if isinstance(seq_pos, torch.Tensor) and seq_pos.device.type != "cpu":
            if seq_pos.is_floating_point() or seq_pos.is_complex() or seq_pos.dtype == torch.bool or \
                    seq_pos.dim() > 1 or (seq_pos.dim() == 1 and seq_pos.shape[0] != state.batch):
                raise InputShapeError(f"expected seq_pos as an int or {state.batch} ints (one per sequence), found a "
                                      f"{seq_pos.dtype} tensor of shape {list(seq_pos.shape)}", layer=self.layer_index)
            return seq_pos.to(device=state.device, dtype=torch.int64).expand(state.batch).contiguous()
        raw = seq_pos.numpy() if isinstance(seq_pos, torch.Tensor) else np.asarray(seq_pos)
        pos = check_seq_pos(seq_pos, raw, state.batch, self.layer_index)
        if (pos == pos[0]).all():
            return int(pos[0])
        host = torch.from_numpy(pos)
        if state.device.type == "cuda":
            host = host.pin_memory()
        return host.to(state.device, non_blocking=True)

    def _run(self, x: torch.Tensor, state: State, reset: torch.Tensor, form: str, chunk_size: int, capture: bool,
             mixer=None):
        """The stages of one call. Without ``capture`` each activation is dropped (``del``) once the
        next stage has read it, so the peak holds the fewest at once (docs/gpu.md, "Memory").

        ``mixer(qkv, a, b) -> (q, k, v, qkv_conv, g, beta, core)`` replaces the sequence-wise stages
        (conv1d, gates, delta rule: :meth:`_mix`); the packed calls of :mod:`.serving` pass theirs,
        so every token-wise stage is this method's own."""
        cfg, eps = self.cfg, self.cfg.rms_norm_eps
        trace = {"x": x} if capture else None
        x_norm = input_norm(x, self.w_in_norm, eps)
        qkv, z, a, b = in_proj_stacked(x_norm, self.w_in, cfg.conv_dim, cfg.num_v_heads)
        if capture:
            trace.update(x_norm=x_norm, qkv=qkv, z=z, a=a, b=b)
        del x_norm
        if mixer is None:
            q, k, v, qkv_conv, g, beta, core = self._mix(qkv, a, b, state, reset, form, chunk_size, capture)
        else:
            q, k, v, qkv_conv, g, beta, core = mixer(qkv, a, b)
        del qkv, a, b
        if capture:
            trace.update(qkv_conv=qkv_conv, q=q, k=k, v=v, g=g, beta=beta, core=core)
        del q, k, v, qkv_conv, g, beta
        core_gated = gated_norm(core, z, self.w_norm, eps)
        del core, z
        attn_out = out_proj(core_gated, self.w_out)
        if capture:
            trace.update(core_gated=core_gated, attn_out=attn_out)
        del core_gated
        h, h_norm = residual_post_norm(x, attn_out, self.w_post_norm, eps)
        del attn_out
        if self.moe is not None:
            mlp_out, block = moe_block(h_norm, self.moe, capture)
        else:
            mlp_out, block = mlp_stacked(h_norm, self.w_gate_up, self.w_down), {}
        if capture:
            trace.update(h=h, h_norm=h_norm, mlp_out=mlp_out, **block)
        del h_norm, block
        out = output(h, mlp_out)
        if not capture:
            return out, {}
        trace["out"] = out
        return out, {name: trace[name].contiguous() for name in TRACE_ORDER[self.mlp_kind]}

    def _mix(self, qkv, a, b, state: State, reset: torch.Tensor, form: str, chunk_size: int, capture: bool):
        """The sequence-wise stages of a plain call: conv1d + q/k norm (a one-token call updates the conv
        state in place), gates, the delta rule (the recurrent state in place)."""
        cfg = self.cfg
        T = qkv.shape[1]
        one_token = T == 1
        q, k, v, qkv_conv, conv_state = conv1d_qk_norm(
            qkv, state.conv_state, self.w_conv, cfg.num_k_heads, cfg.head_k_dim, cfg.num_v_heads, cfg.head_v_dim,
            inplace=one_token, capture=capture, reset=reset,
        )
        if not one_token:
            state.conv_state.copy_(conv_state)
        del conv_state
        g, beta = gates(a, b, self.A_log, self.dt_bias)
        if form == "auto":
            form = "recurrent" if T <= RECURRENT_MAX_TOKENS else "chunked"
        S = state.recurrent_state
        if form == "recurrent":
            core, _ = delta_rule_recurrent(q, k, v, g, beta, S, cfg.scale, out_state=S, reset=reset)
        else:
            core, _ = delta_rule_chunked(q, k, v, g, beta, S, cfg.scale, chunk_size, out_state=S, reset=reset)
        return q, k, v, qkv_conv, g, beta, core

    # --- input checks -----------------------------------------------------------------------------
    def _check_input(self, x, state: State) -> torch.Tensor:
        if not isinstance(state, State):
            raise InputError(f"expected a gpu_impl State, found {type(state).__name__}", layer=self.layer_index)
        check_state(state.cfg, self.cfg, self.layer_index)
        if isinstance(x, torch.Tensor):
            ok, dtype, shape = x.is_floating_point(), x.dtype, tuple(x.shape)
        else:
            x = np.asarray(x)
            ok, dtype, shape = x.dtype.kind == "f", x.dtype, x.shape
        check_x(shape, ok, dtype, self.cfg, state.batch, self.layer_index, accepted="float16/32/64, bfloat16")
        return torch.as_tensor(x).to(device=self.device, dtype=self.dtype).contiguous()
