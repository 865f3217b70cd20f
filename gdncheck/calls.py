"""The call contract every implementation keeps (docs/spec.md §4): input checks and the seq_pos rule.

Neutral bookkeeping, no math: the reference, the Triton path and the precision-emulating layer all
call these, so a call is refused, or a state reset, by the same rule and with the same message in
each (tests/test_call_contract.py runs the contract over every one of them).
"""

from __future__ import annotations

import logging

import numpy as np

from .config import GDNConfig
from .errors import InputDtypeError, InputError, InputShapeError, SeqPosMismatchError


def check_x(shape: tuple[int, ...], is_real_float: bool, dtype, cfg: GDNConfig, batch: int,
            layer: int | None, accepted: str = "float16/32/64") -> None:
    """x must be a real floating array of shape [B, T >= 1, D]."""
    if not is_real_float:
        raise InputDtypeError(f"expected x of a real floating dtype ({accepted}), found {dtype}", layer=layer)
    D = cfg.hidden_size
    if len(shape) != 3 or shape[2] != D or shape[1] < 1 or shape[0] != batch:
        raise InputShapeError(f"expected x of shape [B={batch}, T>=1, D={D}], found {list(shape)}", layer=layer)


def check_state(state_cfg: GDNConfig, cfg: GDNConfig, layer: int | None) -> None:
    """A state made for a layer of these dimensions (the state fingerprint of docs/spec.md §4)."""
    if state_cfg.state_fingerprint() != cfg.state_fingerprint():
        def dims(c: GDNConfig) -> str:
            return f"Hk={c.num_k_heads} Hv={c.num_v_heads} dk={c.head_k_dim} dv={c.head_v_dim} K={c.conv_kernel}"

        raise InputError(f"expected a state of this layer's dimensions ({dims(cfg)}), found one made for "
                         f"{dims(state_cfg)}", layer=layer)


def check_seq_pos(seq_pos, pos: np.ndarray, batch: int, layer: int | None) -> np.ndarray:
    """``seq_pos`` (as given, for messages) and its NumPy form -> int64 positions [B]."""
    if pos.dtype.kind not in "iu" or (pos.ndim == 1 and pos.shape[0] != batch) or pos.ndim > 1:
        raise InputShapeError(
            f"expected seq_pos as an int or {batch} ints (one per sequence), found {seq_pos!r}", layer=layer
        )
    if (pos < 0).any():
        raise InputError(f"expected seq_pos >= 0, found {seq_pos!r}", layer=layer)
    return np.broadcast_to(pos.astype(np.int64), (batch,)).copy()


def rows_to_reset(pos: np.ndarray, seq_len: np.ndarray, *, strict: bool, warned: bool, layer: int | None,
                  logger: logging.Logger) -> tuple[np.ndarray, bool]:
    """The seq_pos rule: rows whose state ``seq_len`` differs from the call's ``seq_pos``.

    Strict mode raises :class:`SeqPosMismatchError` (the caller has changed nothing yet). Otherwise
    a warning is logged the first time for this state (``warned`` False) and the caller resets the
    returned rows to zeros. Returns ``(rows mask, warned after this call)``.
    """
    mismatch = pos != seq_len
    if not mismatch.any():
        return mismatch, warned
    rows = np.flatnonzero(mismatch).tolist()
    detail = ", ".join(f"row {r}: state seq_len={seq_len[r]}, seq_pos={pos[r]}" for r in rows[:4])
    if strict:
        raise SeqPosMismatchError(f"expected seq_pos equal to the state's seq_len, found {detail}", layer=layer)
    if not warned:
        logger.warning("linear_attention state mismatch at layer %s: %s. Resetting the state of row(s) %s.",
                       layer, detail, rows)
    return mismatch, True
