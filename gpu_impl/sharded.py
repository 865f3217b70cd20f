"""The Triton path sharded: one tensor-parallel rank as an inference engine runs it (docs/sharding.md).

A rank is a plain Triton :class:`~.layer.Layer` over its share of the heads
(:func:`gdncheck.sharding.standalone`: its key and value heads, or one key copy per value head where its
range cuts a key group unevenly), run on its state shards; its ``attn_out`` is its ``out_proj`` partial.
The all-reduce is the sum of the partials; the layer's tail then runs once on the reduced output.
The formulas are the reference's (``reference/sharded.py``); this module holds no math of its own.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from gdncheck.config import GDNConfig
from gdncheck.sharding import RankShare, standalone

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
        self._back = np.array([int(np.flatnonzero(self.conv_index == c)[0]) for c in range(len(share.conv_channels(cfg)))])

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
