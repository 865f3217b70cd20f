"""The layer's state on the device (docs/spec.md §4), and device snapshots in the neutral file format.

``conv_state`` [B, conv_dim, K] holds the last K pre-conv qkv columns in the activation dtype
(they are in_proj outputs, already rounded to it, so that dtype loses nothing); ``recurrent_state``
[B, Hv, dk, dv] is fp32 in every profile; ``seq_len`` [B] int64. All three live on the layer's
device. A :class:`DeviceSnapshot` is a deep copy on the device; it saves to and loads from the
file format of :class:`gdncheck.snapshot.Snapshot`, which the reference reads and writes too.

The seq_pos rule's warning without a host synchronisation: while a state has not warned, each
call queues a small report (the old seq_len of every row it reset, -1 elsewhere) on the device
and copies it to pinned host memory behind an event; :meth:`State.flush_warnings` logs a report
once its event has completed (at the end of the call when the copy is done, else at a later one).
On the CPU the report is ready at once.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gdncheck import calls
from gdncheck.calls import PAD_SLOT_ID, rows_to_reset, slots_to_reset
from gdncheck.config import GDNConfig
from gdncheck.snapshot import SNAPSHOT_SCHEMA_VERSION, Snapshot


@dataclass
class DeviceSnapshot:
    """An independent deep copy of a :class:`State`, as torch tensors on the state's device."""

    conv_state: torch.Tensor
    recurrent_state: torch.Tensor
    seq_len: torch.Tensor
    fingerprint: str
    warned: bool = False
    schema_version: int = SNAPSHOT_SCHEMA_VERSION

    @property
    def batch(self) -> int:
        return int(self.seq_len.shape[0])

    def check_compatible(self, fingerprint: str, batch: int, where: str = "restore") -> None:
        """Same checks and errors as :meth:`Snapshot.check_compatible` (schema, dimensions, batch)."""
        Snapshot.check_compatible(self, fingerprint, batch, where)  # type: ignore[arg-type]

    def to_snapshot(self) -> Snapshot:
        """The neutral NumPy snapshot: conv state as float32 (exact for f32, bf16 and f16)."""
        return Snapshot(
            self.conv_state.detach().to("cpu", torch.float32).numpy(),
            self.recurrent_state.detach().to("cpu", torch.float32).numpy(),
            self.seq_len.detach().to("cpu", torch.int64).numpy(),
            self.fingerprint, self.warned, self.schema_version,
        )

    @classmethod
    def from_snapshot(cls, snap: Snapshot, device: str | torch.device = "cpu") -> DeviceSnapshot:
        return cls(
            torch.tensor(np.asarray(snap.conv_state), device=device),
            torch.tensor(np.asarray(snap.recurrent_state), device=device),
            torch.tensor(np.asarray(snap.seq_len, dtype=np.int64), device=device),
            snap.fingerprint, bool(snap.warned), int(snap.schema_version),
        )

    def save(self, path: str | os.PathLike) -> Path:
        """Write the neutral safetensors snapshot file (readable by ``Snapshot.load``)."""
        return self.to_snapshot().save(path)

    @classmethod
    def load(cls, path: str | os.PathLike, device: str | torch.device = "cpu") -> DeviceSnapshot:
        """Read a snapshot file written by either implementation; damaged or foreign files are refused."""
        return cls.from_snapshot(Snapshot.load(path), device)


#: The most elements a state of the whole batch may hold (``B·(conv_dim·K + Hv·dk·dv)``), as in
#: ``gdncheck.reference.state`` but higher (a GPU batch of 8192 real-size states is 4.6e9 elements;
#: gpu_impl never imports the reference): a batch past it is refused before anything is allocated.
MAX_BATCH_STATE_ELEMENTS = 1 << 36  # 2^36 fp32 elements: 256 GiB, beyond any one GPU (an H200 holds 141 GB)


def check_batch(cfg: GDNConfig, batch) -> int:
    """``batch`` as an int, refused (:class:`BatchSizeError`) unless a positive integer whose state
    stays within :data:`MAX_BATCH_STATE_ELEMENTS` (:func:`gdncheck.calls.check_batch`)."""
    return calls.check_batch(cfg, batch, MAX_BATCH_STATE_ELEMENTS)


class State:
    """conv_state [B, conv_dim, K], recurrent_state [B, Hv, dk, dv] fp32, seq_len [B] int64 on
    ``device``, and whether the seq-len warning was logged."""

    def __init__(self, cfg: GDNConfig, batch: int, *, dtype: torch.dtype, device: torch.device):
        batch = check_batch(cfg, batch)
        self.cfg = cfg
        self.conv_state = torch.zeros((batch, cfg.conv_dim, cfg.conv_kernel), dtype=dtype, device=device)
        self.recurrent_state = torch.zeros(
            (batch, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim), dtype=torch.float32, device=device
        )
        self.seq_len = torch.zeros(batch, dtype=torch.int64, device=device)
        self.warned = False
        self._reports: list[_MismatchReport] = []

    @property
    def batch(self) -> int:
        return int(self.seq_len.shape[0])

    @property
    def device(self) -> torch.device:
        return self.recurrent_state.device

    @property
    def fingerprint(self) -> str:
        return self.cfg.state_fingerprint()

    def reset(self, rows=None) -> None:
        """Zero the state of ``rows`` (default: every row; a bool mask or indices) and their seq_len."""
        if rows is None:
            rows = slice(None)
        elif not isinstance(rows, slice):
            rows = torch.as_tensor(np.asarray(rows), device=self.device)
        self.conv_state[rows] = 0
        self.recurrent_state[rows] = 0
        self.seq_len[rows] = 0

    def snapshot(self) -> DeviceSnapshot:
        """An independent deep copy on the device."""
        return DeviceSnapshot(self.conv_state.clone(), self.recurrent_state.clone(), self.seq_len.clone(),
                              self.fingerprint, self.warned)

    def restore(self, snap: DeviceSnapshot | Snapshot) -> None:
        """Copy ``snap`` into this state (its tensors keep their storage); refuse other dimensions.

        A :class:`DeviceSnapshot` of this profile restores bit for bit. A reference
        :class:`Snapshot` (float64) is rounded: the recurrent state to fp32, the conv state to the
        activation dtype.
        """
        snap.check_compatible(self.fingerprint, self.batch)
        self.conv_state.copy_(torch.as_tensor(snap.conv_state))
        self.recurrent_state.copy_(torch.as_tensor(snap.recurrent_state))
        self.seq_len.copy_(torch.as_tensor(np.asarray(snap.seq_len, dtype=np.int64)
                                           if isinstance(snap, Snapshot) else snap.seq_len))
        self.warned = bool(snap.warned)

    # --- the seq_pos rule's warning, without synchronising ------------------------------------------
    def queue_mismatch_report(self, reset: torch.Tensor, pos) -> None:
        """Queue, on the device, which rows this call resets and from which seq_len (before the
        call updates seq_len). ``pos``: the call's positions (an int, host int64 [B], or a device
        tensor [B]). Nothing is queued once the state has warned, on the meta device, or while a
        CUDA graph is being captured (replays of it reset rows without a warning)."""
        dev = self.device
        if self.warned or dev.type == "meta" or (dev.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            return
        old = torch.where(reset, self.seq_len, -1)
        pos = pos if isinstance(pos, torch.Tensor) else torch.as_tensor(np.broadcast_to(pos, (self.batch,)).copy())
        if dev.type != "cuda":
            self._reports.append(_MismatchReport(old, pos.to(torch.int64), None))
            return
        host = torch.empty((2, self.batch), dtype=torch.int64, pin_memory=True)
        host[0].copy_(old, non_blocking=True)
        host[1].copy_(pos, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._reports.append(_MismatchReport(host[0], host[1], event))

    def queue_slot_report(self, report: torch.Tensor) -> None:
        """The packed calls' form of :meth:`queue_mismatch_report` (docs/serving.md): ``report``
        [3, N] int64 on the device holds, per sequence, its slot's seq_len where the call resets
        it (-1 elsewhere), its seq_pos, and its slot; the warning then names sequences and slots."""
        dev = self.device
        if self.warned or dev.type == "meta" or (dev.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            return
        if dev.type != "cuda":
            self._reports.append(_MismatchReport(report[0], report[1], None, report[2]))
            return
        host = torch.empty(report.shape, dtype=torch.int64, pin_memory=True)
        host.copy_(report, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._reports.append(_MismatchReport(host[0], host[1], event, host[2]))

    def flush_warnings(self, logger: logging.Logger, layer: int | None) -> None:
        """Log the first completed report that shows a reset row (once per state); drop the others."""
        while self._reports and self._reports[0].ready():
            report = self._reports.pop(0)
            if not self.warned and report.slots is not None:
                old, pos, slots = report.old.numpy(), report.pos.numpy(), report.slots.numpy()
                seen = np.zeros(self.batch, dtype=np.int64)
                real = slots != PAD_SLOT_ID
                seen[slots[real]] = np.where(old >= 0, old, pos)[real]
                _, self.warned = slots_to_reset(pos, slots, seen, strict=False, warned=False, layer=layer,
                                                logger=logger)
            elif not self.warned:
                old, pos = report.old.numpy(), report.pos.numpy()
                _, self.warned = rows_to_reset(pos, np.where(old >= 0, old, pos), strict=False, warned=False,
                                               layer=layer, logger=logger)
        if self.warned:
            self._reports.clear()

    def __repr__(self) -> str:
        return f"State(batch={self.batch}, seq_len={self.seq_len.tolist()}, device={self.device})"


@dataclass
class _MismatchReport:
    """Rows reset by one call: ``old`` seq_len (-1 where kept) and the call's ``pos``, host tensors
    once ``event`` (None on the CPU) has completed; for a packed call, per sequence, with its ``slots``."""

    old: torch.Tensor
    pos: torch.Tensor
    event: object | None
    slots: torch.Tensor | None = None

    def ready(self) -> bool:
        return self.event is None or self.event.query()
