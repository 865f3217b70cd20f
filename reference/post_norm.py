"""Stage 10, ``post_norm``."""

from __future__ import annotations

import numpy as np

from .functions import rms_norm_one_plus


def post_norm(h: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """h_norm = h / sqrt(mean(h², over D) + eps) · (1 + w_post).

    h: [..., T, D]; weight ``post_attention_layernorm.weight``: [D] -> h_norm: [..., T, D].
    """
    return rms_norm_one_plus(h, weight, eps)
