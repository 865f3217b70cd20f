"""Stage 3, ``conv1d``: causal depthwise convolution with SiLU, and its state."""

from __future__ import annotations

import numpy as np

from .functions import f64, silu


def conv1d(qkv: np.ndarray, conv_state: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """qkv_conv[t, c] = silu(Σ_{j<K} w[c, j] · X̃[c, t - (K-1) + j]).

    X̃ is the conv history followed by the new columns: the state holds the last K **pre-conv**
    columns, oldest first (zeros before the sequence start); ``w[:, K-1]`` multiplies the newest
    token. No bias.

    qkv: [B, T, conv_dim]; conv_state: [B, conv_dim, K]; weight: [conv_dim, 1, K] or [conv_dim, K].
    Returns qkv_conv [B, T, conv_dim] and the new conv_state [B, conv_dim, K] (the last K columns
    of X̃).
    """
    x = f64(qkv)
    w = f64(weight).reshape(weight.shape[0], weight.shape[-1])
    K = w.shape[1]
    T = x.shape[-2]
    history = np.swapaxes(f64(conv_state), -1, -2)  # [B, K, conv_dim], oldest first
    full = np.concatenate([history, x], axis=-2)  # [B, K + T, conv_dim]
    y = np.zeros_like(x)
    for j in range(K):
        # output t reads column t - (K-1) + j of the new tokens, i.e. full[K + t - (K-1) + j]
        y += w[:, j] * full[..., 1 + j : 1 + j + T, :]
    new_state = np.ascontiguousarray(np.swapaxes(full[..., -K:, :], -1, -2))
    return silu(y), new_state
