"""Low-precision number formats as NumPy sees them: bf16 bits, exact rounding, representability.

NumPy has no bfloat16; bf16 values live in float32 arrays (every bf16 is an exact float32) and
travel as uint16 bit patterns.
"""

from __future__ import annotations

import numpy as np

from .profiles import RUN_PROFILES


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """uint16 bf16 bit patterns -> float32 values (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> uint16 bf16 bit patterns, rounded to nearest even; NaN stays NaN."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    rounding = ((u >> 16) & 1) + np.uint32(0x7FFF)
    out = ((u + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = ((u[nan] >> 16) | 0x0040).astype(np.uint16)
    return out


def round_to(x: np.ndarray, profile: str) -> np.ndarray:
    """Round to the profile's dtype (round to nearest even) and return float64 values."""
    x = np.asarray(x)
    if profile == "f64":
        return x.astype(np.float64)
    if profile == "f32":
        return x.astype(np.float32).astype(np.float64)
    if profile == "f16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float64)
    if profile == "bf16":
        # float64 -> float32 first can double-round; values that matter here are already near
        # float32, and the error is at most one float32 ulp before the bf16 rounding.
        with np.errstate(over="ignore", invalid="ignore"):
            return bf16_bits_to_f32(f32_to_bf16_bits(x.astype(np.float32))).astype(np.float64)
    raise ValueError(f"unknown precision profile {profile!r}; expected one of {', '.join(RUN_PROFILES)}")


def round_to_common(x: np.ndarray) -> np.ndarray:
    """Round to values that bf16 *and* f16 both represent exactly (golden weights and inputs).

    bf16 keeps 8 significant bits, f16 11, so a bf16 value is an f16 value when it lies in f16's
    normal range; smaller magnitudes flush to zero, larger ones saturate to the largest shared value.
    """
    r = round_to(x, "bf16")
    tiny = np.abs(r) < 2.0 ** -14
    r = np.where(tiny, 0.0, r)
    big = 65280.0  # largest bf16 value below f16's max 65504
    return np.clip(r, -big, big)


def is_representable(x: np.ndarray, profile: str) -> bool:
    x = np.asarray(x, dtype=np.float64)
    return bool(np.array_equal(round_to(x, profile), x, equal_nan=True))


