"""Stage 2, ``in_proj``: the four input projections, as one GEMM over the stacked weights."""

from __future__ import annotations

import torch


def stack_in_proj(w_qkv: torch.Tensor, w_z: torch.Tensor, w_a: torch.Tensor, w_b: torch.Tensor) -> torch.Tensor:
    """[W_qkv; W_z; W_a; W_b]: [conv_dim + Hv·dv + 2·Hv, D], the weight of :func:`in_proj_stacked`."""
    return torch.cat([w_qkv, w_z, w_a, w_b], dim=0).contiguous()


def in_proj_stacked(
    x_norm: torch.Tensor, w_stacked: torch.Tensor, conv_dim: int, num_v_heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One ``torch.matmul`` in the activation dtype (fp32 accumulation: cuBLAS on a GPU), then views.

    x_norm: [..., T, D]; w_stacked from :func:`stack_in_proj`. Returns views of one contiguous
    [..., T, conv_dim + Hv·dv + 2·Hv] result: qkv [..., T, conv_dim], z [..., T, Hv, dv],
    a [..., T, Hv], b [..., T, Hv]. The kernels downstream read them through their strides.
    """
    y = torch.matmul(x_norm, w_stacked.t())
    value_dim = w_stacked.shape[0] - conv_dim - 2 * num_v_heads
    lead = y.shape[:-1]
    o_z, o_a, o_b = conv_dim, conv_dim + value_dim, conv_dim + value_dim + num_v_heads
    qkv = y[..., :o_z]
    z = y[..., o_z:o_a].unflatten(-1, (num_v_heads, value_dim // num_v_heads))
    a = y[..., o_a:o_b]
    b = y[..., o_b:]
    assert z.shape[:-2] == lead
    return qkv, z, a, b


def in_proj(
    x_norm: torch.Tensor, w_qkv: torch.Tensor, w_z: torch.Tensor, w_a: torch.Tensor, w_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stage ``in_proj`` (reference/in_proj.py).

    Weights in the activation dtype. Returns qkv [..., T, conv_dim], z [..., T, Hv, dv],
    a, b [..., T, Hv] (strided views of one GEMM result).
    """
    return in_proj_stacked(x_norm, stack_in_proj(w_qkv, w_z, w_a, w_b), w_qkv.shape[0], w_a.shape[0])
