"""The layout of a packed call on the device (docs/serving.md): what the packed kernels read.

N sequences one after the other in a stream of ``total`` tokens: sequence n is rows
``cu[n] .. cu[n+1] - 1``, its state in pool slot ``slots[n]`` (-1: a padding sequence, whose state
is zeros and is never written), ``reset[n]`` set when the seq-len rule reads its slot as zeros.
Every kernel grid is sized from shapes alone (N, total, and for the chunked form a bound on the
number of chunks), so a layout held only on the device is run without reading it on the host.

The chunked form cuts each sequence into chunks of C tokens from its first token (no chunk
straddles two sequences): ``cu_chunks[n]`` counts the chunks of the sequences before n, and
``n_chunks`` is their total when the host knows the lengths, else the bound
``(total + N·(C - 1)) // C`` (each sequence adds at most one partial chunk); programs past the
true count do nothing. ``order`` lists the sequences longest first: the chunked state kernel,
whose programs loop over one sequence's chunks, starts the longest ones first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class Packed:
    """A packed call's layout as the kernels read it, int64 tensors on the device."""

    cu: torch.Tensor  # [N + 1] token offsets
    slots: torch.Tensor  # [N] pool slot per sequence, -1 for padding
    reset: torch.Tensor | None  # uint8 [N]: the slot is read as zeros (None: no sequence is reset)
    total: int  # tokens in the stream
    max_len: int  # the longest sequence, or the bound total - N + 1 when only the device knows
    chunk: int = 0  # C of the chunk map (0: none)
    cu_chunks: torch.Tensor | None = None  # [N + 1] chunks before each sequence
    n_chunks: int = 0  # chunks in the stream, or a bound
    order: torch.Tensor | None = None  # [N] sequences, longest first

    @property
    def n(self) -> int:
        return int(self.slots.shape[0])

    @property
    def search_steps(self) -> int:
        """Steps of the binary search of a token's (or chunk's) sequence: ceil(log2 N)."""
        return (self.n - 1).bit_length()

    @property
    def per_token(self) -> bool:
        """Every sequence is one token (a decode batch: N = total), so token t is sequence t."""
        return self.n == self.total


@dataclass(frozen=True)
class Snapshots:
    """States to keep inside a call: for m in ``cu[n] .. cu[n+1] - 1``, sequence ``seq[m] = n`` after
    its first ``off[m]`` tokens (increasing per sequence) goes to row ``dst[m]`` of a destination
    (pool slots for prefix snapshots, packed token rows for a speculative verify)."""

    cu: torch.Tensor  # [N + 1]
    seq: torch.Tensor  # [M]
    off: torch.Tensor  # [M]
    dst: torch.Tensor  # [M]
    inside: bool = True  # some offset may lie inside a chunk (False: all at chunk ends, which cost less)

    @property
    def count(self) -> int:
        return int(self.seq.shape[0])


def chunk_map(cu: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """On the device, without reading it: chunks before each sequence [N + 1] and the sequences
    longest first [N]."""
    lengths = cu[1:] - cu[:-1]
    cu_chunks = torch.zeros_like(cu)
    torch.cumsum(torch.div(lengths + (chunk - 1), chunk, rounding_mode="floor"), 0, out=cu_chunks[1:])
    return cu_chunks, torch.argsort(lengths, descending=True, stable=True)


def chunk_bound(total: int, n: int, chunk: int) -> int:
    """The most chunks N non-empty sequences of ``total`` tokens cut into: Σ ceil(L / C)."""
    return (total + n * (chunk - 1)) // chunk


def every_token(cu: torch.Tensor, total: int) -> Snapshots:
    """Snapshots after every token, each to its own packed row (a speculative verify's steps), on
    the device without reading ``cu``."""
    rows = torch.arange(total, device=cu.device, dtype=torch.int64)
    seq = torch.searchsorted(cu[1:], rows, right=True)
    return Snapshots(cu, seq, rows - cu[seq] + 1, rows)


@triton.jit
def find_segment(p_cu, x, N, n_steps):
    """The largest i in [0, N) with cu[i] <= x (cu non-decreasing from cu[0] = 0, cu[N] > x), for a
    scalar or a block of x: the sequence of packed token x, or of packed chunk x. ``n_steps`` =
    ceil(log2 N) halvings of [lo, hi), cu[lo] <= x < cu[hi]."""
    lo = x * 0
    hi = lo + N
    for _ in range(n_steps):
        mid = (lo + hi) // 2
        below = tl.load(p_cu + mid) <= x
        lo = tl.where(below, mid, lo)
        hi = tl.where(below, hi, mid)
    return lo


def host_layout(lengths, slots, device: torch.device, chunk: int = 0, reset: torch.Tensor | None = None) -> Packed:
    """The layout of sequences of the given ``lengths`` on ``slots``, computed on the host (with the
    chunk map for chunk size ``chunk``, exact) and copied to ``device`` in one copy; no check."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = lengths.shape[0]
    parts = [np.concatenate([[0], np.cumsum(lengths)]), np.asarray(slots, dtype=np.int64)]
    if chunk:
        chunks = (lengths + chunk - 1) // chunk
        parts += [np.concatenate([[0], np.cumsum(chunks)]), np.argsort(-lengths, kind="stable")]
    host = torch.from_numpy(np.concatenate(parts))
    if device.type == "cuda":
        host = host.pin_memory()
    dev = host.to(device, non_blocking=device.type == "cuda")
    cu, ids = dev[:n + 1], dev[n + 1:2 * n + 1]
    if not chunk:
        return Packed(cu, ids, reset, int(lengths.sum()), int(lengths.max()))
    return Packed(cu, ids, reset, int(lengths.sum()), int(lengths.max()), chunk, dev[2 * n + 1:3 * n + 2],
                  int(chunks.sum()), dev[3 * n + 2:])
