"""keras-hub's Qwen3.5 linear attention in bf16 loses precision twice: (1) Keras casts the recurrent state to bf16
on every call, and (2) its delta rules normalise q and k in bf16.

(1) ``Qwen3_5GatedDeltaNet`` receives its cache ``(conv_state, recurrent_state)`` as a call argument, and Keras 3's
``Layer.__call__`` converts every floating tensor among a layer's arguments to its compute dtype (autocast): under
a bfloat16 policy the float32 recurrent state reaches ``_recurrent_gated_delta_rule`` rounded to bf16, each call,
although the rule keeps it in float32 and returns it so. A decode rounds the state once per token.

(2) The rules call ``_l2norm`` on the bf16 query and key and only then cast them to float32, where transformers
(and the float64 reference) cast first and normalise in float32.

Standalone: imports only keras (torch backend), keras_hub, torch, numpy and the standard library.

keras-hub 0.32.0's ``_recurrent_gated_delta_rule`` and ``_chunk_gated_delta_rule``
(keras_hub/src/models/qwen3_5/qwen3_5_gated_delta_net.py) begin with ``query = _l2norm(query)``,
``key = _l2norm(key)`` in the layer's compute dtype, then ``ops.cast(..., "float32")``. In bf16 every normalised q
and k element carries a rounding of up to 2^-9 relative that a float32 normalisation does not: a decode step's
output error is that of its q, and the state's that of every k written into it, so over a long decode the rule's
output drifts further than the bf16 inputs alone make it drift.

For (1) this script calls keras-hub's own layer with a float32 state and records the dtype the rule receives.
For (2) it runs keras-hub's own ``_recurrent_gated_delta_rule`` token by token for a long decode (bf16 inputs,
the state in float32 between steps, as keras-hub's cache keeps it), twice: as shipped, and with ``_l2norm``
patched to cast to float32 first (the one change); each against a float64 recurrence on the same bf16 inputs.

    python conformance/engines/keras/repros/keras_bf16_l2norm.py

Exit status: 1 while either reproduces ((1): the rule receives a bf16 state; (2): keras-hub's error is over twice
the float32-normalised one), 0 when neither does, 3 when keras-hub cannot be run here.
"""

from __future__ import annotations

import os
import sys

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "torch")
try:
    import torch
    from keras import ops
    from keras_hub.src.models.qwen3_5 import qwen3_5_gated_delta_net as gdn
except ImportError as exc:
    print(f"cannot run: needs keras (torch backend), keras-hub and torch ({exc})")
    sys.exit(3)

STEPS, H, D = 2048, 2, 8


def l2norm_f32(x, axis=-1, eps=1e-6):
    """The one change: normalise in float32, as transformers does (cast first)."""
    x = ops.cast(x, "float32")
    return x * ops.rsqrt(ops.sum(x * x, axis=axis, keepdims=True) + eps)


def decode(q, k, v, g, beta) -> np.ndarray:
    """keras-hub's recurrent rule called once per token, its float32 state carried between calls."""
    state, outs = None, []
    for t in range(q.shape[1]):
        out, state = gdn._recurrent_gated_delta_rule(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g[:, t:t + 1],
                                                     beta[:, t:t + 1], initial_state=state, output_final_state=True)
        outs.append(out.float().numpy())
    return np.concatenate(outs, axis=1)


def reference(q, k, v, g, beta) -> np.ndarray:
    """The gated delta rule in float64 on the same (bf16) inputs: q, k normalised in float64."""
    q, k, v, g, beta = (t.double().numpy() for t in (q, k, v, g, beta))
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(D)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    S = np.zeros((q.shape[0], H, D, D))
    out = np.empty_like(v)
    for t in range(q.shape[1]):
        S = S * np.exp(g[:, t])[..., None, None]
        delta = (v[:, t] - np.einsum("bhk,bhkv->bhv", k[:, t], S)) * beta[:, t][..., None]
        S = S + np.einsum("bhk,bhv->bhkv", k[:, t], delta)
        out[:, t] = np.einsum("bhk,bhkv->bhv", q[:, t], S)
    return out


def state_dtype_seen_by_the_rule() -> str:
    """(1): one decode step of keras-hub's Qwen3_5GatedDeltaNet (bf16 policy) with a float32 state; the dtype of
    the state its recurrent rule is handed."""
    layer = gdn.Qwen3_5GatedDeltaNet(hidden_size=16, linear_num_key_heads=1, linear_num_value_heads=H,
                                     linear_key_head_dim=D, linear_value_head_dim=D, dtype="bfloat16")
    layer.build((None, None, 16))
    conv = torch.zeros(1, 2 * D + H * D, 3, dtype=torch.bfloat16)
    state = torch.full((1, H, D, D), 1.0 + 2.0 ** -12, dtype=torch.float32)  # not a bf16 number
    seen = []
    rule = gdn._recurrent_gated_delta_rule

    def spy(*args, **kwargs):
        seen.append(kwargs["initial_state"].dtype)
        return rule(*args, **kwargs)

    gdn._recurrent_gated_delta_rule = spy
    try:
        layer(torch.ones(1, 1, 16, dtype=torch.bfloat16), cache=(conv, state))
    finally:
        gdn._recurrent_gated_delta_rule = rule
    return str(seen[0]).replace("torch.", "")


def main() -> int:
    seen = state_dtype_seen_by_the_rule()
    print(f"(1) a float32 recurrent state handed to Qwen3_5GatedDeltaNet (bf16 policy) reaches "
          f"_recurrent_gated_delta_rule as {seen}: {'reproduces' if seen != 'float32' else 'fixed'}")
    rng = np.random.default_rng(7)
    bf = lambda a: torch.tensor(a, dtype=torch.float32).to(torch.bfloat16)  # noqa: E731
    q, k, v = (bf(rng.normal(size=(1, STEPS, H, D))) for _ in range(3))
    g = torch.tensor(-rng.uniform(0, 2e-3, size=(1, STEPS, H)), dtype=torch.float32)  # long memory
    beta = bf(rng.uniform(0.2, 0.9, size=(1, STEPS, H)))
    want = reference(q, k, v, g, beta)
    nmse = lambda got: float(((got - want) ** 2).sum() / (want ** 2).sum())  # noqa: E731
    shipped = nmse(decode(q, k, v, g, beta))
    saved = gdn._l2norm
    gdn._l2norm = l2norm_f32
    try:
        patched = nmse(decode(q, k, v, g, beta))
    finally:
        gdn._l2norm = saved
    print(f"(2) keras-hub's _recurrent_gated_delta_rule, {STEPS} decode steps, bf16 q/k/v/beta, float32 state")
    print(f"  NMSE against float64 on the same inputs: as shipped (q, k normalised in bf16) {shipped:.3e}; "
          f"q, k normalised in float32 {patched:.3e} (x{shipped / patched:.1f})")
    bad = shipped > 2 * patched
    print(f"    q and k normalised in bf16: {'reproduces' if bad else 'fixed'}")
    return 1 if bad or seen != "float32" else 0


if __name__ == "__main__":
    sys.exit(main())
