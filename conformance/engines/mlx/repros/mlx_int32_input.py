"""mlx-lm's Qwen3.5 GatedDeltaNet layer computes on an int32 input instead of refusing it.

Standalone (imports only mlx, mlx-lm, numpy and the standard library): ``python mlx_int32_input.py``.

The layer's input is a hidden state, a floating-point tensor. An integer tensor there is a caller's bug
(token ids passed where embeddings belong, a wrong cast), and an engine should refuse it (gdncheck's
suite expects the error ``input_dtype``; fixtures/FORMAT.md section 6). mlx-lm's ``DecoderLayer`` runs
it instead: MLX promotes the int32 array inside its ops and returns a floating-point result, so the bug
goes unnoticed. This script builds mlx-lm's own ``qwen3_5`` ``DecoderLayer`` (a linear-attention layer)
with tiny random weights, calls it with an int32 ``x``, and compares what it returns with a float64
computation of the same layer (same weights, written out below in NumPy) on ``x.astype(float64)``: the
numbers are the layer's on the promoted input, computed, not refused.

Seen with mlx 0.32.4 and mlx-lm 0.32.2 (gdncheck case ``error-input-dtype``, profiles f32 and bf16).
"""

from __future__ import annotations

import sys
from importlib.metadata import version

import numpy as np

#: the exit status when the repro cannot run (the engine is not installed here): neither fixed (0) nor reproduced (1)
CANNOT_RUN = 3

try:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3_5
except ImportError as exc:
    print(f"cannot run: needs MLX and mlx-lm (pip install \"mlx[cpu]\" mlx-lm): {exc}", file=sys.stderr)
    sys.exit(CANNOT_RUN)

D, HK, HV, DK, DV, K, FF, EPS = 8, 1, 2, 4, 4, 4, 8, 1e-6


def build_layer() -> qwen3_5.DecoderLayer:
    """mlx-lm's own layer 0 (linear attention) of a tiny Qwen3.5 text model, random weights."""
    mx.random.seed(0)
    args = qwen3_5.TextModelArgs(
        model_type="qwen3_5_text", hidden_size=D, intermediate_size=FF, num_hidden_layers=1, vocab_size=16,
        num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=EPS, linear_num_key_heads=HK,
        linear_num_value_heads=HV, linear_key_head_dim=DK, linear_value_head_dim=DV, linear_conv_kernel_dim=K)
    layer = qwen3_5.DecoderLayer(args, layer_idx=0)
    rng = np.random.default_rng(0)
    # nonzero norm weights and dt_bias, so that every weight matters
    layer.update({"input_layernorm": {"weight": mx.array(rng.uniform(0.5, 1.5, D).astype(np.float32))},
                  "post_attention_layernorm": {"weight": mx.array(rng.uniform(0.5, 1.5, D).astype(np.float32))}})
    mx.eval(layer.parameters())
    return layer


def float64_layer(p: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The same layer in float64, one call from an empty state: the math of mlx-lm's modules
    (nn.RMSNorm with its weight as stored, causal depthwise conv + SiLU, L2-normalised q and k with the
    dk^-1/2 readout scale, g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b), the recurrent gated
    delta rule, the gated RMSNorm, SwiGLU MLP, two residuals)."""
    def rms(t, w):
        return t / np.sqrt(np.mean(t * t, axis=-1, keepdims=True) + EPS) * w

    def silu(t):
        return t / (1.0 + np.exp(-t))

    B, T, _ = x.shape
    xn = rms(x, p["input_layernorm.weight"])
    qkv = xn @ p["linear_attn.in_proj_qkv.weight"].T
    z = (xn @ p["linear_attn.in_proj_z.weight"].T).reshape(B, T, HV, DV)
    a = xn @ p["linear_attn.in_proj_a.weight"].T
    b = xn @ p["linear_attn.in_proj_b.weight"].T
    w = p["linear_attn.conv1d.weight"][:, :, 0]  # [C, K]
    padded = np.concatenate([np.zeros((B, K - 1, qkv.shape[-1])), qkv], axis=1)
    conv = silu(np.stack([np.einsum("bkc,ck->bc", padded[:, t:t + K], w) for t in range(T)], axis=1))
    q = conv[..., :HK * DK].reshape(B, T, HK, DK)
    k = conv[..., HK * DK:2 * HK * DK].reshape(B, T, HK, DK)
    v = conv[..., 2 * HK * DK:].reshape(B, T, HV, DV)
    q = q / np.sqrt(np.sum(q * q, -1, keepdims=True) + 1e-6) * DK ** -0.5
    k = k / np.sqrt(np.sum(k * k, -1, keepdims=True) + 1e-6)
    q, k = np.repeat(q, HV // HK, axis=2), np.repeat(k, HV // HK, axis=2)  # value head j reads key head j // (HV/HK)
    g = -np.exp(p["linear_attn.A_log"]) * np.log1p(np.exp(a + p["linear_attn.dt_bias"]))
    beta = 1.0 / (1.0 + np.exp(-b))
    S = np.zeros((B, HV, DK, DV))
    core = np.zeros((B, T, HV, DV))
    for t in range(T):
        S = S * np.exp(g[:, t])[..., None, None]
        kt, qt = k[:, t], q[:, t]
        delta = (v[:, t] - np.einsum("bhk,bhkv->bhv", kt, S)) * beta[:, t][..., None]
        S = S + kt[..., :, None] * delta[..., None, :]
        core[:, t] = np.einsum("bhk,bhkv->bhv", qt, S)
    gated = rms(core, p["linear_attn.norm.weight"]) * silu(z)
    h = x + gated.reshape(B, T, HV * DV) @ p["linear_attn.out_proj.weight"].T
    hn = rms(h, p["post_attention_layernorm.weight"])
    mlp = (silu(hn @ p["mlp.gate_proj.weight"].T) * (hn @ p["mlp.up_proj.weight"].T)) @ p["mlp.down_proj.weight"].T
    return h + mlp


def main() -> int:
    print(f"mlx {version('mlx')}, mlx-lm {version('mlx-lm')}, MLX device {mx.default_device()}")
    layer = build_layer()
    params = {k: np.array(v.astype(mx.float32), dtype=np.float64) for k, v in tree_flatten(layer.parameters())}
    x = np.random.default_rng(1).integers(-3, 4, size=(1, 3, D)).astype(np.int32)
    try:
        out = layer(mx.array(x))  # an int32 input: should be refused
        mx.eval(out)
    except Exception as exc:  # noqa: BLE001 - what a correct engine does
        print(f"refused: {type(exc).__name__}: {exc}")
        print("mlx-lm refuses an int32 input now: the finding is fixed in this version")
        return 0
    expected = float64_layer(params, x.astype(np.float64))
    got = np.array(out.astype(mx.float32), dtype=np.float64)
    err = np.max(np.abs(got - expected)) / np.max(np.abs(expected))
    print(f"input: int32 {list(x.shape)}; returned: {out.dtype} {list(out.shape)}, not an error")
    print(f"float64 layer on x.astype(float64): max |out| {np.max(np.abs(expected)):.4g}; "
          f"MLX's result differs by {err:.2e} of it (relative to the largest element)")
    print("so MLX computed the layer on the promoted input instead of refusing it (expected: an input_dtype "
          "error, fixtures/FORMAT.md section 6)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
