"""Elementwise functions several stages share, in float64, written for accuracy over speed.

``sigmoid`` and ``softplus`` use ``logaddexp`` so that neither overflows nor loses the tail:
softplus is the exact ``log(1 + e^x)`` at every x (torch's threshold-20 shortcut differs by < 3e-9).
"""

from __future__ import annotations

import numpy as np


def f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)), exact for all x."""
    return np.logaddexp(0.0, x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) = exp(-softplus(-x)), without overflow."""
    return np.exp(-np.logaddexp(0.0, -x))


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x)."""
    return x * sigmoid(x)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2, last axis) + eps) * weight (weight applied as given)."""
    x = f64(x)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * f64(weight)


def rms_norm_one_plus(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """The layer RMSNorm of Qwen3.5: x / sqrt(mean(x^2) + eps) * (1 + w)."""
    return rms_norm(x, 1.0 + f64(weight), eps)


def l2_normalize(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """x / sqrt(sum(x^2, last axis) + eps), the eps inside the sqrt."""
    x = f64(x)
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)
