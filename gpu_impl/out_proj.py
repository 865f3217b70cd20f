"""Stage 8, ``out_proj``."""

from __future__ import annotations

import torch


def out_proj(core_gated: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Stage ``out_proj`` (reference/out_proj.py).

    core_gated: [..., T, Hv, dv]; weight: [D, Hv·dv] in the same dtype. ``torch.matmul`` (cuBLAS on
    a GPU, fp32 accumulation). Returns attn_out [..., T, D].
    """
    return torch.matmul(core_gated.flatten(-2), weight.t())
