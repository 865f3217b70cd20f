"""Stage 3, ``conv1d``: causal depthwise convolution with SiLU, and its state."""

from __future__ import annotations

import numpy as np

from .functions import f64, pieces, silu


def conv1d(qkv: np.ndarray, conv_state: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """qkv_conv[t, c] = silu(Σ_{j<K} w[c, j] · u[c, t - (K-1) + j]), u[c, t] = qkv[t, c] for t >= 0 and
    u[c, -i] = conv_state[c, K - i] (the history, newest at -1): X̃[K + t] = u[t] below.

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
    # X̃ = [history; x], so X̃[K + t] = x[t]; output t reads X̃[K + t - (K-1) + j] = X̃[t + 1 + j] with w[:, j]
    out = np.empty(x.shape)
    for rows in pieces(T, x.shape[-1]):
        L = rows.stop - rows.start
        window = _rows_of_history_and_x(history, x, rows.start + 1, rows.stop + K)  # X̃[t0+1 : t1+K]
        y = window[..., 0:L, :] * w[:, 0]
        for j in range(1, K):
            y += window[..., j : j + L, :] * w[:, j]
        out[..., rows, :] = silu(y, out=y)
    new_state = np.ascontiguousarray(np.swapaxes(_rows_of_history_and_x(history, x, T, T + K), -1, -2))
    return out, new_state


def _rows_of_history_and_x(history: np.ndarray, x: np.ndarray, a: int, b: int) -> np.ndarray:
    """Rows a..b-1 of X̃ = [history; x] (history: [B, K, C], x: [B, T, C]); a view when they are all in x."""
    K = history.shape[-2]
    if a >= K:
        return x[..., a - K : b - K, :]
    return np.concatenate([history[..., a : min(b, K), :], x[..., : max(0, b - K), :]], axis=-2)
