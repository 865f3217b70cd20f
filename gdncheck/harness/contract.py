"""The port contract: how the suite drives a Python implementation of the layer.

`gdncheck run MODULE:CALLABLE` imports `CALLABLE` from `MODULE` and calls it once per case::

    impl = CALLABLE(cfg, weights, profile="bf16", strict=False, **options)

A refused configuration or weight must raise (a `gdncheck.errors.GDNError`, or any exception with a
string `code`: fixtures/FORMAT.md §6); what the implementation cannot express raises
`NotApplicable` with the reason (from the factory, any method, or its optional
`check_case(config, program)`). The object returned implements `Implementation`; `LayerAdapter`
turns a layer shaped like `gdncheck.reference.Layer` into one in one line.

Which parts of the fixture format it implements, the factory (or the object it returns) may say in an
optional `features` attribute, names of `gdncheck.features.FEATURES` (`{"packed_calls",
"spec_decode", ...}`; `gdncheck.features.features_up_to("1.1")` for a port written against format 1.1).
A case that requires another (its manifest `requires`, fixtures/FORMAT.md §2) is not applicable from
the first step that needs it, with the reason `requires commit_snapshots (format 1.2)`, instead of
running a step whose fields the port would ignore. Without `features`, every feature is taken as
implemented (a missing method still raises `NotApplicable`).

The arguments, the methods and what each must do: docs/plugins.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from gdncheck.calls import check_free_slots


class NotApplicable(Exception):  # noqa: N818 - a verdict, not an error
    """The implementation cannot express this case or call; the message says why (docs/plugins.md).

    Not a failure: ``run`` records the reason and the step in the outputs' metadata
    (``not_applicable``, ``not_applicable_step``) and ``verify`` reports the case ``not_applicable``."""

    code = "not_applicable"


@runtime_checkable
class Implementation(Protocol):
    """What the runner needs from an implementation. Arrays may be NumPy arrays or anything
    :func:`to_numpy` converts (torch tensors included). Optional, beside the methods: ``features``, the
    format features it implements (module docstring; absent: all), and the serving methods of
    :class:`LayerAdapter`."""

    name: str

    def new_state(self, batch: int) -> Any:
        """A zero state for ``batch`` sequences (seq_len 0)."""

    def forward(self, x: np.ndarray, state: Any, seq_pos: np.ndarray) -> tuple[Any, Mapping[str, Any]]:
        """Run x [B, T, D] (float32 values exact in the profile) at positions ``seq_pos`` [B] (int64);
        update ``state`` in place; return ``(out, trace)``, trace holding any stage tensors by name."""

    def state_arrays(self, state: Any) -> Mapping[str, Any]:
        """``conv_state`` [B, conv_dim, K] and ``recurrent_state`` [B, Hv, dk, dv]; ``seq_len`` [B] if kept."""

    def snapshot(self, state: Any) -> Any:
        """An independent deep copy of ``state``."""

    def restore(self, state: Any, snap: Any) -> None:
        """Make ``state`` equal to ``snap`` (a copy: later calls must not change ``snap``)."""

    def save_snapshot(self, snap: Any, path: str) -> None:
        """Write ``snap`` to the safetensors file ``path`` (tensors conv_state, recurrent_state, seq_len)."""

    def load_snapshot(self, path: str) -> Any:
        """Read a snapshot written by :meth:`save_snapshot`."""


def to_numpy(value: Any) -> np.ndarray:
    """NumPy array of any array-like, torch tensors (any device, bf16 included) too."""
    if isinstance(value, np.ndarray):
        return value
    mod = type(value).__module__
    if mod.startswith("torch"):
        t = value.detach()
        if str(t.dtype) in ("torch.bfloat16",):
            t = t.float()
        return t.cpu().numpy()
    return np.asarray(value)


class LayerAdapter:
    """An :class:`Implementation` around a layer shaped like ``gdncheck.reference.Layer``.

    The layer has ``new_state(batch)`` and ``forward(x, state, seq_pos) -> (out, trace)``; its state
    has attributes ``conv_state``, ``recurrent_state``, ``seq_len`` and methods ``snapshot()`` and
    ``restore(snap)``; a snapshot has ``save(path)``; ``load_snapshot`` reads one back.
    ``prepare_input`` converts the runner's float32 NumPy input (default: unchanged).

    ``serving``: how it runs the serving ops (docs/serving.md, FORMAT.md §4.1), the state being the
    pool: a module with ``forward_packed``, ``prefix_snapshots``, ``verify_spec``, ``commit`` (its snapshot
    requests optional) and ``forward_mixed`` (optional: not applicable without it) taking the layer first
    (``gdncheck.reference.serving``, ``gdncheck.gpu_impl.serving``; or
    :mod:`.plain_serving`, each sequence as a plain call on a one-row state, the definition: for layers
    that only *earn* bounds, never to claim a packed path), or None (the serving ops are not
    applicable). ``serving_options``: keyword arguments of its calls.
    """

    def __init__(self, layer: Any, name: str, *, load_snapshot: Callable[[str], Any],
                 prepare_input: Callable[[np.ndarray], Any] | None = None, stage_runner: Any = None,
                 serving: Any = None, serving_options: Mapping[str, Any] | None = None):
        self.layer = layer
        self.name = name
        self._load = load_snapshot
        self._prepare = prepare_input or (lambda x: x)
        self._serving = serving
        self._serving_options = dict(serving_options or {})
        if stage_runner is not None:
            self.run_stage = stage_runner  # optional: stage-isolated mode (FORMAT.md §8)

    def new_state(self, batch: int) -> Any:
        return self.layer.new_state(batch)

    def forward(self, x: np.ndarray, state: Any, seq_pos: np.ndarray):
        return self.layer.forward(self._prepare(x), state, seq_pos)

    def state_arrays(self, state: Any) -> dict[str, Any]:
        return {"conv_state": state.conv_state, "recurrent_state": state.recurrent_state, "seq_len": state.seq_len}

    def snapshot(self, state: Any) -> Any:
        return state.snapshot()

    def restore(self, state: Any, snap: Any) -> None:
        state.restore(snap)

    def save_snapshot(self, snap: Any, path: str) -> None:
        snap.save(path)

    def load_snapshot(self, path: str) -> Any:
        return self._load(path)

    # --- the serving ops (optional; FORMAT.md §4.1) --------------------------------------------------
    def _pattern(self, name: str):
        if self._serving is None:
            raise NotApplicable(f"{self.name} runs no serving patterns (packed calls over state slots, "
                                f"docs/serving.md): no {name}")
        return getattr(self._serving, name, None)

    def forward_packed(self, x, pool, cu_seqlens, seq_pos, slots):
        return self._pattern("forward_packed")(self.layer, pool, self._prepare(x), cu_seqlens, seq_pos, slots,
                                               **self._serving_options)

    def prefix_snapshots(self, x, pool, cu_seqlens, seq_pos, slots, snap_seq, snap_offset, snap_slot):
        return self._pattern("prefix_snapshots")(self.layer, pool, self._prepare(x), cu_seqlens, seq_pos, slots,
                                                 snap_seq, snap_offset, snap_slot, **self._serving_options)

    def verify_spec(self, x, pool, cu_seqlens, seq_pos, slots):
        return self._pattern("verify_spec")(self.layer, pool, self._prepare(x), cu_seqlens, seq_pos, slots,
                                            **self._serving_options)

    def forward_mixed(self, x, pool, cu_seqlens, seq_pos, slots, verify):
        fn = self._pattern("forward_mixed")
        if fn is None:
            raise NotApplicable(f"{self.name} runs no mixed serving batches (verify rows beside plain rows)")
        return fn(self.layer, pool, self._prepare(x), cu_seqlens, seq_pos, slots, verify, **self._serving_options)

    def commit(self, spec, accepted, snap_seq=(), snap_offset=(), snap_slot=()) -> None:
        if len(snap_seq):  # a commit keeping accepted prefixes (docs/serving.md §4)
            self._pattern("commit")(spec, accepted, snap_seq, snap_offset, snap_slot)
        else:
            self._pattern("commit")(spec, accepted)

    def free(self, pool, slots) -> None:
        """Zero the slots and their seq_len (a finished request): the state's ``reset(rows)``."""
        self._pattern("free")  # refused where the serving patterns do not run
        size = len(pool.seq_len)  # the pool's slots (NumPy or torch, on any device)
        pool.reset(check_free_slots(slots, size, None))  # -1 or out of range: slot_index, nothing freed


class StageOnly:
    """The layer half of the contract for a port of stages only (a kernel library, one op of an engine's
    graph): every layer method is :class:`NotApplicable` with ``no_layer``, the subclass's reason, so
    such a port is judged in stage-isolated mode alone (``run_stage``: the subclass's)."""

    no_layer = "this port runs stages only (stage-isolated mode)"

    def forward(self, x, state, seq_pos):
        raise NotApplicable(self.no_layer)

    def new_state(self, batch: int):
        raise NotApplicable(self.no_layer)

    def state_arrays(self, state):
        raise NotApplicable(self.no_layer)

    def snapshot(self, state):
        raise NotApplicable(self.no_layer)

    def restore(self, state, snap) -> None:
        raise NotApplicable(self.no_layer)

    def save_snapshot(self, snap, path: str) -> None:
        raise NotApplicable(self.no_layer)

    def load_snapshot(self, path: str):
        raise NotApplicable(self.no_layer)

def error_code(exc: BaseException) -> str:
    """The error code an exception stands for: its ``code`` attribute, else its class name."""
    code = getattr(exc, "code", None)
    return code if isinstance(code, str) and code else type(exc).__name__
