"""An independent, scalar, loop-based formulation of the whole GDN layer (tests only).

Written from docs/spec.md with Python floats and the ``math`` module, token by token and element by
element, sharing no code with ``gdncheck.reference``. Only for tiny shapes.
"""

from __future__ import annotations

import math

import numpy as np


def _silu(u):
    return u / (1.0 + math.exp(-u)) if u > -700 else 0.0


def _rmsnorm(vec, w, eps, one_plus):
    ms = sum(x * x for x in vec) / len(vec)
    inv = 1.0 / math.sqrt(ms + eps)
    return [x * inv * ((1.0 + wi) if one_plus else wi) for x, wi in zip(vec, w)]


def _matvec(W, vec):
    return [sum(W[r][c] * vec[c] for c in range(len(vec))) for r in range(len(W))]


def naive_layer(cfg, weights, x_seq, conv_hist=None, S=None):
    """One sequence: x_seq [T][D] (lists) -> (out [T][D], conv_hist [K][conv_dim], S [Hv][dk][dv])."""
    W = {k: np.asarray(v, dtype=np.float64).tolist() for k, v in weights.items()}
    D, Hk, Hv, dk, dv, K = (cfg.hidden_size, cfg.num_k_heads, cfg.num_v_heads, cfg.head_k_dim,
                            cfg.head_v_dim, cfg.conv_kernel)
    eps = cfg.rms_norm_eps
    r = Hv // Hk
    key_dim = Hk * dk
    conv_dim = 2 * key_dim + Hv * dv
    conv_w = [[row[0][j] for j in range(K)] for row in W["linear_attn.conv1d.weight"]]
    if conv_hist is None:
        conv_hist = [[0.0] * conv_dim for _ in range(K)]
    if S is None:
        S = [[[0.0] * dv for _ in range(dk)] for _ in range(Hv)]
    norm_w = W["linear_attn.norm.weight"]
    outs = []
    for x in x_seq:
        xn = _rmsnorm(x, W["input_layernorm.weight"], eps, True)
        qkv = _matvec(W["linear_attn.in_proj_qkv.weight"], xn)
        z = _matvec(W["linear_attn.in_proj_z.weight"], xn)
        a = _matvec(W["linear_attn.in_proj_a.weight"], xn)
        b = _matvec(W["linear_attn.in_proj_b.weight"], xn)
        conv_hist = conv_hist[1:] + [qkv]
        conv = [_silu(sum(conv_w[c][j] * conv_hist[j][c] for j in range(K))) for c in range(conv_dim)]
        core = []
        for h in range(Hv):
            kh = h // r
            q = conv[kh * dk:(kh + 1) * dk]
            k = conv[key_dim + kh * dk:key_dim + (kh + 1) * dk]
            v = conv[2 * key_dim + h * dv:2 * key_dim + (h + 1) * dv]
            qn = math.sqrt(sum(e * e for e in q) + 1e-6)
            kn = math.sqrt(sum(e * e for e in k) + 1e-6)
            q = [e / qn for e in q]
            k = [e / kn for e in k]
            ah = a[h] + W["linear_attn.dt_bias"][h]
            sp = ah + math.log1p(math.exp(-ah)) if ah > 0 else math.log1p(math.exp(ah))
            g = -math.exp(W["linear_attn.A_log"][h]) * sp
            beta = 1.0 / (1.0 + math.exp(-b[h]))
            decay = math.exp(g)
            Sh = [[decay * S[h][i][j] for j in range(dv)] for i in range(dk)]
            m = [sum(k[i] * Sh[i][j] for i in range(dk)) for j in range(dv)]
            delta = [beta * (v[j] - m[j]) for j in range(dv)]
            Sh = [[Sh[i][j] + k[i] * delta[j] for j in range(dv)] for i in range(dk)]
            S[h] = Sh
            o = [dk ** -0.5 * sum(q[i] * Sh[i][j] for i in range(dk)) for j in range(dv)]
            wn = norm_w[h * dv:(h + 1) * dv] if len(norm_w) == Hv * dv else norm_w
            on = _rmsnorm(o, wn, eps, False)
            zh = z[h * dv:(h + 1) * dv]
            core.extend(on[j] * _silu(zh[j]) for j in range(dv))
        attn = _matvec(W["linear_attn.out_proj.weight"], core)
        hres = [x[i] + attn[i] for i in range(D)]
        hn = _rmsnorm(hres, W["post_attention_layernorm.weight"], eps, True)
        gate = _matvec(W["mlp.gate_proj.weight"], hn)
        up = _matvec(W["mlp.up_proj.weight"], hn)
        act = [_silu(gi) * ui for gi, ui in zip(gate, up)]
        mlp = _matvec(W["mlp.down_proj.weight"], act)
        outs.append([hres[i] + mlp[i] for i in range(D)])
    return outs, conv_hist, S
