"""The Triton path sharded: one tensor-parallel rank as an inference engine runs it, and one context-parallel
rank (docs/sharding.md).

A tensor-parallel rank is a plain Triton :class:`~.layer.Layer` over its share of the heads
(:func:`gdncheck.sharding.standalone`: its key and value heads, or one key copy per value head where its
range cuts a key group unevenly), run on its state shards; its ``attn_out`` is its ``out_proj`` partial.
The all-reduce is the sum of the partials; the layer's tail then runs once on the reduced output.
A context-parallel rank (:func:`context_parallel_rank`) runs the whole layer on its tokens: it sends its
segments' last pre-conv rows (the halos its successors' convs read), computes each segment's affine summary
``S_end = M·S_start + U`` with the Triton path's own recurrent delta-rule kernel (the state widened to
``[dk, dv + dk]``, entered as ``[0 | I]``, the values as ``[v | 0]``: its first ``dv`` columns end as ``U``,
its last ``dk`` as ``M``), merges its predecessors' summaries into its entry state (a float32 matmul, as an
engine merges) and runs its tokens from there. The formulas are the reference's (``reference/sharded.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from gdncheck.config import GDNConfig
from gdncheck.sharding import CPPlan, RankShare, gathered, plan_from_json, share_order, standalone

from .conv1d import conv1d_qk_norm
from .delta_rule import delta_rule_recurrent
from .gates import gates
from .in_proj import in_proj_stacked
from .input_norm import input_norm
from .layer import Layer


class RankLayer:
    """Tensor-parallel rank ``share.rank`` of a layer on the Triton path.

    >>> rank = RankLayer(cfg, weights, share, profile="f32")
    >>> state = rank.new_state(conv_shard, recurrent_shard, seq_len)   # the rank's shards
    >>> partial, trace = rank.forward(x, state, seq_pos)               # partial: [B, T, D], before the all-reduce
    """

    def __init__(self, cfg: GDNConfig, weights: Mapping[str, np.ndarray], share: RankShare, **layer_options):
        self.share = share
        self.cfg_r, w_r, self.conv_index = standalone(cfg, share, weights)
        self.layer = Layer(self.cfg_r, w_r, **layer_options)
        # the share's conv channels, read back from the first layer channel holding each
        self._back = share_order(self.conv_index, len(share.conv_channels(cfg)))

    def new_state(self, conv_shard, recurrent_shard, seq_len):
        """A device state of this rank's layer holding the given shards (share layout, :func:`state_shards`)."""
        state = self.layer.new_state(batch=len(seq_len))
        state.conv_state.copy_(torch.as_tensor(np.asarray(conv_shard)[:, self.conv_index], dtype=state.conv_state.dtype))
        state.recurrent_state.copy_(torch.as_tensor(np.asarray(recurrent_shard), dtype=state.recurrent_state.dtype))
        state.seq_len.copy_(torch.as_tensor(np.asarray(seq_len), dtype=state.seq_len.dtype))
        return state

    def shards(self, state) -> tuple[np.ndarray, np.ndarray]:
        """The state's shards in the share's layout, as float64 arrays on the host."""
        conv = state.conv_state.detach().to("cpu", torch.float64).numpy()[:, self._back]
        return conv, state.recurrent_state.detach().to("cpu", torch.float64).numpy()

    def forward(self, x, state, seq_pos) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One call on the rank: ``(partial, trace)``; ``partial`` is the rank's ``attn_out`` (before the
        all-reduce); the trace's stage tensors are the rank layer's (its heads), ``qkv`` and ``qkv_conv`` in the
        share's channel order (:meth:`gdncheck.sharding.RankShare.conv_channels`)."""
        _, trace = self.layer.forward(x, state, seq_pos, capture=True)
        for name in ("qkv", "qkv_conv"):  # the rank layer's channels -> the share's (q | k | v of its heads)
            trace[name] = trace[name][..., torch.as_tensor(self._back, device=trace[name].device)]
        return trace["attn_out"], trace


def context_parallel_rank(cfg: GDNConfig, weights: Mapping[str, np.ndarray], plan, rank: int, comm, xs: Mapping,
                          conv_state, recurrent_state, **layer_options) -> dict[str, np.ndarray]:
    """Rank ``rank`` of a context-parallel ``plan`` (a :class:`~gdncheck.sharding.CPPlan` or its JSON) on the
    Triton path: ``xs`` its segments' tokens (segment index -> ``[B, n, D]``), ``conv_state`` [B, C, K] and
    ``recurrent_state`` [B, Hv, dk, dv] the call's entering state, ``comm.all_gather_object`` the exchange (as
    ``torch.distributed``). Returns per segment ``segments.{i}.{halo, M, U, entry_state, out, attn_out,
    conv_state, recurrent_state}`` as float64 arrays (fixtures/FORMAT.md §7.1; ``attn_out``, the segment's
    ``out_proj`` output, is a tensor × context-parallel rank's partial where ``cfg`` is its TP share's layer)."""
    plan = plan if isinstance(plan, CPPlan) else plan_from_json(plan, cfg)
    layer = Layer(cfg, weights, **layer_options)
    K, dk, dv, Hv = cfg.conv_kernel, cfg.head_k_dim, cfg.head_v_dim, cfg.num_v_heads
    mine = [i for i, (r, _, _) in enumerate(plan.segments) if r == rank]
    conv0 = torch.as_tensor(np.asarray(conv_state), dtype=torch.float32, device=layer.device)
    rec0 = torch.as_tensor(np.asarray(recurrent_state), dtype=torch.float32, device=layer.device)
    B = conv0.shape[0]

    def stream(i: int):
        """Segment i's pre-conv qkv and its a, b (the layer's input norm and projection kernels)."""
        x = torch.as_tensor(np.asarray(xs[i])).to(device=layer.device, dtype=layer.dtype).contiguous()
        qkv, _, a, b = in_proj_stacked(input_norm(x, layer.w_in_norm, cfg.rms_norm_eps), layer.w_in, cfg.conv_dim, Hv)
        return qkv, a, b

    # 1. my segments' pre-conv rows (their last K), gathered by every rank: the conv halos
    streams = {i: stream(i) for i in mine}
    tails = gathered(comm, plan.world, {i: _host(streams[i][0][:, -K:]) for i in mine})
    halos = {}
    for i in mine:
        rows = [torch.as_tensor(tails[j], dtype=torch.float32, device=layer.device) for j in range(i)]
        cols = torch.cat([conv0, *(r.transpose(-1, -2) for r in rows)], dim=-1)  # oldest column first
        halos[i] = cols[..., cols.shape[-1] - K:].to(layer.dtype).contiguous()
    # 2. my segments' summaries, from the zero state with their halos (the layer's conv, q/k norm and gates
    # kernels, then its recurrent kernel on the widened state), gathered by every rank
    summaries = {}
    for i in mine:
        qkv, a, b = streams.pop(i)
        q, k, v, _, _ = conv1d_qk_norm(qkv, halos[i], layer.w_conv, cfg.num_k_heads, dk, Hv, dv)
        g, beta = gates(a, b, layer.A_log, layer.dt_bias)
        wide = torch.cat([v, torch.zeros((*v.shape[:-1], dk), dtype=v.dtype, device=v.device)], dim=-1)
        start = torch.zeros((B, Hv, dk, dv + dk), dtype=torch.float32, device=v.device)
        start[..., dv:] = torch.eye(dk, dtype=torch.float32, device=v.device)
        _, end = delta_rule_recurrent(q, k, wide, g, beta, start, cfg.scale)
        summaries[i] = (_host(end[..., dv:]), _host(end[..., :dv]))
    summaries = gathered(comm, plan.world, summaries)
    # 3. my entry states: the call's state through my predecessors' summaries, in token order; my tokens from there
    out: dict[str, np.ndarray] = {}
    for i in mine:
        entry = rec0
        for j in range(i):
            M, U = (torch.as_tensor(a, dtype=torch.float32, device=layer.device) for a in summaries[j])
            entry = torch.matmul(M, entry) + U
        state = layer.new_state(batch=B)
        state.conv_state.copy_(halos[i])
        state.recurrent_state.copy_(entry)
        state.seq_len.fill_(1)  # a continuation: the seq_pos rule resets nothing
        y, trace = layer.forward(xs[i], state, 1, capture=True)
        M, U = summaries[i]
        for name, t in (("halo", _host(halos[i])), ("M", M), ("U", U), ("entry_state", _host(entry)),
                        ("out", _host(y)), ("attn_out", _host(trace["attn_out"])),
                        ("conv_state", _host(state.conv_state)),
                        ("recurrent_state", _host(state.recurrent_state))):
            out[f"segments.{i}.{name}"] = np.ascontiguousarray(t, dtype=np.float64)
    return out


def _host(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()
