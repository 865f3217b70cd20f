"""Stage 10, ``post_norm``: the post-attention RMSNorm (1 + w).

The layer's fast path computes it fused with the residual add (:func:`.residual.residual_post_norm`).
"""

from __future__ import annotations

import torch

from .input_norm import rms_norm_one_plus


def post_norm(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Stage ``post_norm`` (the formula: reference/post_norm.py).

    h: [..., T, D]; weight ``post_attention_layernorm.weight``: [D]. Returns h_norm in h's dtype.
    """
    return rms_norm_one_plus(h, weight, eps)
