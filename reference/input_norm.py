"""Stage 1, ``input_norm``."""

from __future__ import annotations

import numpy as np

from .functions import rms_norm_one_plus


def input_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x_norm = x / sqrt(mean(x², over D) + eps) · (1 + w_in).

    x: [..., T, D]; weight ``input_layernorm.weight``: [D]  ->  x_norm: [..., T, D].
    The weight is zero-centred: (1 + w), the Gemma convention.
    """
    return rms_norm_one_plus(x, weight, eps)
