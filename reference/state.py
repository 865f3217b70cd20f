"""The layer's state between calls (docs/spec.md §4), for a batch of independent sequences."""

from __future__ import annotations

import numpy as np

from gdncheck import calls
from gdncheck.config import GDNConfig
from gdncheck.snapshot import Snapshot

#: The most elements a state of the whole batch may hold (``B·(conv_dim·K + Hv·dk·dv)``; 16 GiB of
#: float64): a batch past it is refused before anything is allocated, not a MemoryError (or a swap
#: storm) in NumPy. Qwen3.5's state is about 1.1 M elements per sequence: a batch of about 1900.
MAX_BATCH_STATE_ELEMENTS = 1 << 31


def check_batch(cfg: GDNConfig, batch) -> int:
    """``batch`` as an int, refused (:class:`BatchSizeError`) unless a positive integer whose state
    stays within :data:`MAX_BATCH_STATE_ELEMENTS` (:func:`gdncheck.calls.check_batch`)."""
    return calls.check_batch(cfg, batch, MAX_BATCH_STATE_ELEMENTS)


class State:
    """conv_state [B, conv_dim, K] (last K pre-conv columns, oldest first), recurrent_state
    [B, Hv, dk, dv], seq_len [B] (tokens consumed), and whether the seq-len warning was logged."""

    def __init__(self, cfg: GDNConfig, batch: int):
        batch = check_batch(cfg, batch)
        self.cfg = cfg
        self.conv_state = np.zeros((batch, cfg.conv_dim, cfg.conv_kernel))
        self.recurrent_state = np.zeros((batch, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim))
        self.seq_len = np.zeros(batch, dtype=np.int64)
        self.warned = False

    @property
    def batch(self) -> int:
        return int(self.seq_len.shape[0])

    @property
    def fingerprint(self) -> str:
        return self.cfg.state_fingerprint()

    def reset(self, rows=None) -> None:
        """Zero the state of ``rows`` (default: every row) and set their seq_len to 0."""
        rows = slice(None) if rows is None else rows
        self.conv_state[rows] = 0.0
        self.recurrent_state[rows] = 0.0
        self.seq_len[rows] = 0

    def snapshot(self) -> Snapshot:
        """An independent deep copy of the state."""
        return Snapshot(self.conv_state, self.recurrent_state, self.seq_len, self.fingerprint, self.warned)

    def restore(self, snap: Snapshot) -> None:
        """Replace the state by a deep copy of ``snap``; refuse a snapshot of other dimensions."""
        snap.check_compatible(self.fingerprint, self.batch)
        self.conv_state = np.array(snap.conv_state, dtype=np.float64, copy=True)
        self.recurrent_state = np.array(snap.recurrent_state, dtype=np.float64, copy=True)
        self.seq_len = np.array(snap.seq_len, dtype=np.int64, copy=True)
        self.warned = bool(snap.warned)

    def __repr__(self) -> str:
        return f"State(batch={self.batch}, seq_len={self.seq_len.tolist()})"
