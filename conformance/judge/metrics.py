"""Error metrics of one tensor against its float64 golden (no verdicts here; see `.verdicts`).

Each tensor's error is measured in the space where the quantity acts, by the rule `RULES` names
for it: `scaled` (activations, the core, the states: `|a_i - e_i| / (|e_i| + s_i)`, `s_i` the RMS
of `i`'s group, `group_axes`, `CaseStats`), `log_decay` (`g`), `relative` (`beta`), `unit` (`a`,
`b`); `core_gated` is further divided by the gated norm's condition (`gated_norm_conditions`).
The NMSE of a call is normalised by the tensor's mean square over the whole case; SQNR, max
absolute and relative errors, ulps and the cosine are reported, not judged.

The rules, their groups and why: docs/tolerances.md §1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gdncheck.profiles import PROFILES
from gdncheck.stages import STATE_NAMES

CASE_WIDE = ("core", "core_gated", "attn_out")
#: The error rule of each tensor that is not ``scaled`` (module docstring).
RULES: dict[str, str] = {"g": "log_decay", "beta": "relative", "a": "unit", "b": "unit"}
#: ``ln 2⁻¹²⁶``: a decay ``exp(g)`` below float32's smallest normal is zero to every state.
LOG_DECAY_FLOOR = -126.0 * math.log(2.0)


def rule_of(tensor: str) -> str:
    return RULES.get(tensor, "scaled")


def group_axes(tensor: str, ndim: int) -> tuple[int, ...]:
    """Axes, within one call's [B, ...] tensor, that one group spans."""
    if tensor == "recurrent_state":
        return tuple(range(2, ndim))  # [B, Hv, dk, dv]: per head
    if tensor == "conv_state":
        return tuple(range(1, ndim))  # [B, conv_dim, K]: per sequence
    if tensor in CASE_WIDE:
        return tuple(range(1, ndim))  # per sequence (and across calls: CaseStats)
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
        if tensor in CASE_WIDE:
            sums = sum(np.sum(a * a, axis=group_axes(tensor, a.ndim), keepdims=True) for a in arrays)
            counts = sum(np.prod([a.shape[i] for i in group_axes(tensor, a.ndim)]) for a in arrays)
            self.scale = np.sqrt(sums / counts)

        self.conditions: dict[int, np.ndarray] = {}  # call -> κ of the gated norm (core_gated only)

    def condition(self, call: int | None) -> np.ndarray | None:
        return self.conditions.get(call) if call is not None else None


def gated_norm_conditions(cores: dict[int, np.ndarray], eps: float) -> dict[int, np.ndarray]:
    """Per call, the condition ``κ = C / sqrt(mean_dv(core²) + eps)`` of the gated norm at each
    sequence, token and head ([B, T, Hv, 1]): how much it magnifies an error of ``core``, whose size is
    that of the head's reads of the state, ``C`` (the RMS of the head's core over the case), not that
    of a core that happens to be small (a query nearly orthogonal to the stored keys)."""
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in cores.items()}
    if not arrays:
        return {}
    sums = sum(np.sum(a * a, axis=(1, 3), keepdims=True) for a in arrays.values())  # [B, 1, Hv, 1]
    counts = sum(a.shape[1] * a.shape[3] for a in arrays.values())
    C = np.sqrt(sums / counts)
    return {k: C / np.sqrt(np.mean(a * a, axis=-1, keepdims=True) + eps) for k, a in arrays.items()}


def case_stats(goldens: dict[str, dict[int, np.ndarray]], eps: float) -> dict[str, CaseStats]:
    """CaseStats of every tensor of a case from its goldens (tensor -> call -> array), with the
    gated norm's conditions on ``core_gated`` where the case keeps ``core`` for the same calls."""
    stats = {name: CaseStats(name, list(calls.values())) for name, calls in goldens.items()}
    if "core_gated" in stats and "core" in goldens:
        cores = {k: v for k, v in goldens["core"].items() if k in goldens["core_gated"]}
        stats["core_gated"].conditions = gated_norm_conditions(cores, eps)
    return stats


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


def error_denominator(expected: np.ndarray, tensor: str, profile: str, stats: CaseStats | None = None,
                      call: int | None = None) -> np.ndarray:
    """What an absolute error of each element is divided by (its rule, module docstring), broadcast
    to ``expected``'s shape: the allowed deviation of an element is ``elem`` times this."""
    e = np.asarray(expected, dtype=np.float64)
    fin = np.abs(np.where(np.isfinite(e), e, 0.0))
    rule = rule_of(tensor)
    if rule == "log_decay":
        return 1.0 + np.minimum(fin, -LOG_DECAY_FLOOR)
    if rule == "relative":
        return fin + 2.0 ** PROFILES[profile].subnormal_exponent
    if rule == "unit":
        return 1.0 + fin
    denom = fin + group_scale(e, tensor, profile, stats)
    kappa = stats.condition(call) if stats is not None else None
    if kappa is not None and kappa.shape[:-1] == e.shape[:-1]:
        denom = denom * np.maximum(kappa, 1.0)
    return np.broadcast_to(denom, e.shape)


def scaled_error(actual: np.ndarray, expected: np.ndarray, tensor: str, profile: str,
                 stats: CaseStats | None = None, call: int | None = None) -> np.ndarray:
    """err_i of the module docstring; NaN where actual is NaN, +inf where an infinity is unmatched."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    same_inf = np.isinf(a) & (a == e)
    with np.errstate(invalid="ignore", over="ignore"):
        if rule_of(tensor) == "log_decay":  # below the floor a decay is zero: g is the floor there
            diff = np.abs(np.maximum(a, LOG_DECAY_FLOOR) - np.maximum(e, LOG_DECAY_FLOOR))
            same_inf = same_inf | (np.isneginf(a) & (e <= LOG_DECAY_FLOOR))
        elif rule_of(tensor) == "relative":  # storing the exact value costs half an ulp: no error
            fin = np.where(np.isfinite(e), e, 0.0)
            diff = np.maximum(np.abs(a - e) - 0.5 * ulp_spacing(fin, profile), 0.0)
        else:
            diff = np.abs(a - e)
        diff = np.where(same_inf, 0.0, diff)
        err = diff / error_denominator(e, tensor, profile, stats, call)
    err = np.where(np.isinf(a) & ~same_inf, np.inf, err)
    return np.where(np.isnan(a), np.nan, err)


def tensor_metrics(actual: np.ndarray, expected: np.ndarray, tensor: str, profile: str,
                   stats: CaseStats | None = None, err: np.ndarray | None = None,
                   call: int | None = None) -> TensorMetrics:
    """Every metric of the module docstring; non-finite elements are counted and left out of the rest."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if err is None:
        err = scaled_error(a, e, tensor, profile, stats, call)
    nan = np.isnan(a)
    inf_bad = np.isinf(a) & np.isinf(err)  # an infinity the rule does not match (scaled_error)
    bad = nan | inf_bad
    first = _index(int(np.flatnonzero(bad.ravel())[0]), a.shape) if bad.any() else None
    ok = np.isfinite(a) & np.isfinite(e)
    # a port may output anything finite: a square or a quotient past float64 is inf, and says so
    with np.errstate(all="ignore"):
        d = np.where(ok, a - e, 0.0)
        ev = np.where(ok, e, 0.0)
        av = np.where(ok, a, 0.0)
        se = float(np.sum(ev * ev))
        sd = float(np.sum(d * d))
        if rule_of(tensor) != "scaled":  # the error is already normalised where the quantity acts
            fe = np.where(np.isfinite(err), err, 0.0)
            nmse = float(np.mean(fe * fe)) if fe.size else 0.0
        else:
            denom = (stats.mean_square * a.size) if stats is not None else se
            nmse = sd / denom if denom > 0 else (0.0 if sd == 0 else math.inf)
        sqnr = math.inf if nmse == 0 else (-10.0 * math.log10(nmse) if math.isfinite(nmse) else -math.inf)
        absd = np.abs(d)
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
