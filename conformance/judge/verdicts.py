"""The verdict on one tensor: the rules, in order, and the record that says why.

1. missing: a required output (``out``, ``conv_state``, ``recurrent_state`` end to end) fails;
   any other stage tensor is recorded ``missing`` (a port need not expose every intermediate).
2. dtype: floating dtypes only, no narrower than the profile's (states: float32 or wider for the
   recurrent state, the profile's dtype or wider for the conv state).
3. shape: exactly the golden's.
4. NaN anywhere fails; an infinity passes only where the golden holds the same infinity (or, for
   ``g``, a ``-inf`` where the golden decay is below float32's smallest normal: :mod:`.metrics`).
5. the bound: the elementwise error of the tensor's rule (:mod:`.metrics`) at most ``elem`` everywhere and the
   NMSE at most ``nmse`` (:mod:`.tolerances`).
"""

from __future__ import annotations

import numpy as np

from gdncheck.profiles import PROFILES, STATE_OUTPUTS
from gdncheck.stages import stage_index, stage_of

from . import messages
from .metrics import (
    CaseStats,
    downsample_max,
    error_denominator,
    has_tokens,
    scaled_error,
    tensor_metrics,
    token_errors,
)
from .records import Record
from .tolerances import Bound


def allowed_dtypes(tensor: str, profile: str) -> tuple[tuple[str, ...], str]:
    """The safetensors dtypes ``tensor`` may be written in at ``profile``, and why (for the message)."""
    if tensor == "recurrent_state":
        return STATE_OUTPUTS, "the recurrent state is kept in float32 or wider"
    return PROFILES[profile].outputs, f"profile {profile} stores activations in {profile} or wider"


def base_record(case: str, step: int, op: str, call: int | None, tensor: str, **kw) -> Record:
    stage = stage_of(tensor)
    return Record(case=case, step=step, op=op, call=call, tensor=tensor, stage=stage, stage_index=stage_index(stage),
                  verdict="pass", **kw)


def judge(rec: Record, actual: np.ndarray | None, dtype: str | None, expected: np.ndarray, bound: Bound, *,
          required: bool, subject: messages.Subject | str, where: messages.Where | str,
          stats: CaseStats | None = None) -> Record:
    """Fill ``rec`` (verdict, reason, message, metrics...) for ``actual`` against ``expected``."""
    rec.expected_shape = list(expected.shape)
    rec.bound = bound.to_json()
    if actual is None:
        if required:
            return messages.fail(rec, "missing_required",
                                 messages.missing_required(subject=subject, key=rec.actual_ref["key"], where=where))
        rec.verdict = "missing"
        return rec
    rec.dtype, rec.shape = dtype, list(actual.shape)
    allowed, why = allowed_dtypes(rec.tensor, bound.profile)
    if dtype not in allowed:
        failure = messages.dtype_failure(subject=subject, dtype=dtype, allowed=allowed, why=why, where=where)
        return messages.fail(rec, "dtype", failure)
    if tuple(actual.shape) != tuple(expected.shape):
        return messages.fail(rec, "shape", messages.shape_failure(subject=subject, shape=actual.shape,
                                                                     expected=expected.shape, where=where))
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    err = scaled_error(a, e, rec.tensor, bound.profile, stats, rec.call)
    m = tensor_metrics(a, e, rec.tensor, bound.profile, stats, err=err, call=rec.call)
    rec.metrics = m.to_json()
    rec.min_tolerance = {"elem": m.max_err if m.nan == 0 and m.inf_mismatch == 0 else float("inf"), "nmse": m.nmse}
    over_mask = ~(err <= bound.elem)  # NaN and unmatched infinities count as over
    rec.over_bound = int(over_mask.sum())
    if has_tokens(rec.tensor) and err.ndim >= 2:
        starts, values = downsample_max(token_errors(err))
        rec.token_profile = {"token": starts, "max_err": values}
        bad = over_mask.reshape(err.shape[0], err.shape[1], -1).any(axis=2)  # [B, T]
        if bad.any():
            t = int(np.flatnonzero(bad.any(axis=0))[0])
            row = int(np.flatnonzero(bad[:, t])[0])
            rec.first_bad_token, rec.first_bad_row = t, row
            rec.first_bad_position = (rec.seq_pos[row] + t) if rec.seq_pos else t
    if m.nan:
        return messages.fail(rec, "nan", messages.nan_failure(subject=subject, count=m.nan, index=m.first_nonfinite,
                                                              where=where))
    if m.inf_mismatch:
        idx = tuple(m.first_nonfinite)
        return messages.fail(rec, "inf", messages.inf_failure(subject=subject, count=m.inf_mismatch, index=list(idx),
                                                              actual=float(a[idx]), expected=float(e[idx]),
                                                              where=where))
    elem_failed = m.max_err > bound.elem
    nmse_failed = m.nmse > bound.nmse
    if elem_failed or nmse_failed:
        idx = tuple(m.max_err_index)
        scale = float(error_denominator(e, rec.tensor, bound.profile, stats, rec.call)[idx])
        first = (rec.first_bad_token, rec.first_bad_position, rec.first_bad_row) if rec.first_bad_token is not None \
            else None
        failure = messages.bound_failure(subject=subject, metrics=rec.metrics, bound=rec.bound, actual=float(a[idx]),
                                         expected=float(e[idx]), allowed=bound.elem * scale, over=rec.over_bound,
                                         first=first, elem_failed=elem_failed, where=where)
        return messages.fail(rec, "elem_bound" if elem_failed else "nmse_bound", failure)
    return rec

