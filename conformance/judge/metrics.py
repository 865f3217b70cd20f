"""Error metrics of one tensor against its float64 golden (no verdicts here; see :mod:`.verdicts`).

The elementwise error that bounds apply to is *scaled*: ``err_i = |a_i - e_i| / (|e_i| + s_i)``,
where ``s_i`` is the RMS of the expected values in ``i``'s group (:func:`group_axes`, :class:`CaseStats`).
It is a relative error for large elements and an error relative to the group's size for elements
near zero, where a relative error means nothing (a projection that cancels, a read ``q·S`` of a
decayed state). ``s_i`` never drops below the profile dtype's smallest normal.

Groups, chosen from measured conditioning (docs/tolerances.md):

- one token of one sequence: the norms, projections, conv, q k v, and the residual stream;
- one sequence over the whole case (every call): ``a b core core_gated attn_out``. The delta rule's
  read ``q·S`` of a decayed state cancels whenever q is nearly orthogonal to the last keys, in every
  head sharing that q at once, so one token (or a one-token call) can be tiny everywhere; the gated
  norm then scales that noise up to unit size;
- one head of one sequence over the whole case: ``g beta`` (their size is set by the head's weights);
- one head of one call: ``recurrent_state`` (over dk x dv); one sequence of one call: ``conv_state``.

The NMSE of a call is ``Σ(a-e)² / (n · m)`` with ``m`` the tensor's mean square over the whole case
(the classic ``Σ(a-e)²/Σe²`` for a one-call case), for the same reason.

Also reported, not judged: NMSE = Σ(a-e)²/Σe² and SQNR = -10·log10(NMSE) (dB), max absolute and
max relative error with their indices, the largest distance in units in the last place of the
profile's dtype (at the expected value), cosine similarity, and the largest error per token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gdncheck.profiles import PROFILES
from gdncheck.stages import STATE_NAMES

CASE_WIDE = ("a", "b", "core", "core_gated", "attn_out")
HEAD_OVER_CASE = ("g", "beta")


def group_axes(tensor: str, ndim: int) -> tuple[int, ...]:
    """Axes, within one call's [B, ...] tensor, that one group spans."""
    if tensor == "recurrent_state":
        return tuple(range(2, ndim))  # [B, Hv, dk, dv]: per head
    if tensor == "conv_state":
        return tuple(range(1, ndim))  # [B, conv_dim, K]: per sequence
    if tensor in CASE_WIDE:
        return tuple(range(1, ndim))  # per sequence (and across calls: CaseStats)
    if tensor in HEAD_OVER_CASE:
        return (1,)  # [B, T, Hv]: per head (and across calls)
    return tuple(range(2, ndim))  # [B, T, ...]: per token


class CaseStats:
    """Scales of one tensor over every call of a case (from the goldens): the group RMS for the
    case-wide groups, and the mean square that normalises a call's NMSE."""

    def __init__(self, tensor: str, arrays: list[np.ndarray]):
        self.tensor = tensor
        arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
        total = sum(float(np.sum(a * a)) for a in arrays)
        count = sum(a.size for a in arrays)
        self.mean_square = total / count if count else 0.0
        self.scale = None
        if tensor in CASE_WIDE or tensor in HEAD_OVER_CASE:
            sums = sum(np.sum(a * a, axis=group_axes(tensor, a.ndim), keepdims=True) for a in arrays)
            counts = sum(np.prod([a.shape[i] for i in group_axes(tensor, a.ndim)]) for a in arrays)
            self.scale = np.sqrt(sums / counts)

    @classmethod
    def of(cls, tensor: str, expected: np.ndarray) -> CaseStats:
        """Stats of a tensor seen alone (a one-call case)."""
        return cls(tensor, [expected])


def has_tokens(tensor: str) -> bool:
    return tensor not in STATE_NAMES


def ulp_spacing(e: np.ndarray, profile: str) -> np.ndarray:
    """Distance between adjacent numbers of the profile's dtype at |e| (subnormals included)."""
    p = PROFILES[profile]
    bits, min_exp = p.bits, p.subnormal_exponent
    _, ex = np.frexp(np.abs(e))
    ex = np.where(np.asarray(e) == 0, min_exp + bits, ex)
    return np.ldexp(1.0, np.maximum(ex - bits, min_exp))


@dataclass
class TensorMetrics:
    numel: int
    nan: int
    inf_mismatch: int
    first_nonfinite: list[int] | None
    nmse: float
    sqnr_db: float
    max_abs: float
    max_abs_index: list[int] | None
    max_rel: float
    max_rel_index: list[int] | None
    max_ulp: float
    cosine: float
    max_err: float
    max_err_index: list[int] | None

    def to_json(self) -> dict:
        return {k: _json_num(v) for k, v in self.__dict__.items()}


def _json_num(v):
    if isinstance(v, float) and not math.isfinite(v):
        return "inf" if v > 0 else ("-inf" if v < 0 else "nan")
    return v


def _index(flat: int, shape) -> list[int]:
    return [int(i) for i in np.unravel_index(flat, shape)]


def group_scale(expected: np.ndarray, tensor: str, profile: str, stats: CaseStats | None = None) -> np.ndarray:
    """s_i (broadcastable to ``expected``): the group RMS, floored at the dtype's smallest normal."""
    e = np.asarray(expected, dtype=np.float64)
    fin = np.where(np.isfinite(e), e, 0.0)
    if stats is not None and stats.scale is not None:
        s = stats.scale
    elif e.ndim:
        s = np.sqrt(np.mean(fin * fin, axis=group_axes(tensor, e.ndim), keepdims=True))
    else:
        s = np.abs(fin)
    return np.maximum(s, PROFILES[profile].smallest_normal)


def scaled_error(actual: np.ndarray, expected: np.ndarray, tensor: str, profile: str,
                 stats: CaseStats | None = None) -> np.ndarray:
    """err_i of the module docstring; NaN where actual is NaN, +inf where an infinity is unmatched."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    same_inf = np.isinf(a) & (a == e)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(same_inf, 0.0, np.abs(a - e))
        fin = np.where(np.isfinite(e), e, 0.0)
        err = diff / (np.abs(fin) + group_scale(e, tensor, profile, stats))
    err = np.where(np.isinf(a) & ~same_inf, np.inf, err)
    return np.where(np.isnan(a), np.nan, err)


def tensor_metrics(actual: np.ndarray, expected: np.ndarray, tensor: str, profile: str,
                   stats: CaseStats | None = None, err: np.ndarray | None = None) -> TensorMetrics:
    """Every metric of the module docstring; non-finite elements are counted and left out of the rest."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if err is None:
        err = scaled_error(a, e, tensor, profile, stats)
    nan = np.isnan(a)
    same_inf = np.isinf(a) & (a == e)
    inf_bad = np.isinf(a) & ~same_inf
    bad = nan | inf_bad
    first = _index(int(np.flatnonzero(bad.ravel())[0]), a.shape) if bad.any() else None
    ok = np.isfinite(a) & np.isfinite(e)
    with np.errstate(invalid="ignore"):
        d = np.where(ok, a - e, 0.0)
    ev = np.where(ok, e, 0.0)
    av = np.where(ok, a, 0.0)
    se = float(np.sum(ev * ev))
    sd = float(np.sum(d * d))
    denom = (stats.mean_square * a.size) if stats is not None else se
    nmse = sd / denom if denom > 0 else (0.0 if sd == 0 else math.inf)
    sqnr = math.inf if nmse == 0 else (-10.0 * math.log10(nmse) if math.isfinite(nmse) else -math.inf)
    absd = np.abs(d)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(absd == 0, 0.0, absd / np.abs(ev))
    ulp = absd / ulp_spacing(ev, profile) if profile in PROFILES else absd
    na = float(np.sqrt(np.sum(av * av)))
    cos = 1.0 if na == 0 and se == 0 else (float(np.sum(av * ev)) / (na * math.sqrt(se)) if na and se else 0.0)
    finite_err = np.where(np.isfinite(err), err, -1.0)
    size = a.size
    return TensorMetrics(
        numel=int(size), nan=int(nan.sum()), inf_mismatch=int(inf_bad.sum()), first_nonfinite=first,
        nmse=nmse, sqnr_db=sqnr,
        max_abs=float(absd.max()) if size else 0.0, max_abs_index=_index(int(absd.argmax()), a.shape) if size else None,
        max_rel=float(rel.max()) if size else 0.0, max_rel_index=_index(int(rel.argmax()), a.shape) if size else None,
        max_ulp=float(ulp.max()) if size else 0.0,
        cosine=cos,
        max_err=float(finite_err.max()) if size else 0.0,
        max_err_index=_index(int(finite_err.argmax()), a.shape) if size else None,
    )


def token_errors(err: np.ndarray) -> np.ndarray:
    """Largest scaled error per token [T] (over the batch and the token's elements); NaN counts as inf."""
    e = np.where(np.isnan(err), np.inf, err)
    return e.reshape(e.shape[0], e.shape[1], -1).max(axis=(0, 2)) if e.ndim >= 2 and e.size else np.zeros(0)


def downsample_max(values: np.ndarray, points: int = 64) -> tuple[list[int], list[float]]:
    """(start index of each bin, max over the bin): at most ``points`` bins, for drift plots."""
    n = len(values)
    if n == 0:
        return [], []
    width = max(1, -(-n // points))
    starts = list(range(0, n, width))
    return starts, [float(np.max(values[s: s + width])) for s in starts]
