"""Small shared helpers for tests: tiny configs and random inputs."""

from __future__ import annotations

import numpy as np

from gdncheck.config import GDNConfig


def tiny_config(Hk=2, Hv=4, dk=4, dv=3, D=8, I=12, K=4, **kw) -> GDNConfig:
    return GDNConfig(hidden_size=D, intermediate_size=I, num_k_heads=Hk, num_v_heads=Hv, head_k_dim=dk,
                     head_v_dim=dv, conv_kernel=K, **kw)


def unit(rng, *shape):
    x = rng.normal(size=shape)
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


def delta_inputs(rng, B, T, Hk, Hv, dk, dv, g_range=(-2.0, 0.0), beta_range=(0.0, 1.0)):
    q = unit(rng, B, T, Hk, dk)
    k = unit(rng, B, T, Hk, dk)
    v = rng.normal(size=(B, T, Hv, dv))
    g = rng.uniform(*g_range, size=(B, T, Hv))
    beta = rng.uniform(*beta_range, size=(B, T, Hv))
    return q, k, v, g, beta


def rel_err(a, b) -> float:
    """max |a - b| / max |b| (normwise relative error; 0 when both are zero)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    denom = np.abs(b).max() if b.size else 0.0
    num = np.abs(a - b).max() if a.size else 0.0
    return float(num / denom) if denom > 0 else float(num)


#: Tags of the committed cases left out of the light selections: those too heavy to run many times (the
#: real-head-size cases, the dk = dv = 128 cases and the 2048-token decode), and the sharded cases, which
#: run rank by rank through the sharded methods that the mutants and wrapped ports of those selections lack
#: (not applicable to them; tests/ports/test_sharded_run.py runs them). The others are the ``light_cases``
#: fixture (tests/conftest.py).
HEAVY_TAGS = ("real-heads", "long", "real-size", "sharded")


#: Unit roundoff of each profile's activation dtype (half its machine epsilon).
UNIT_ROUNDOFF = {"f32": 2.0**-24, "bf16": 2.0**-8, "f16": 2.0**-11}


def routing_decided(router_logits, top_k: int, profile: str, logit_drift: float = 0.0) -> np.ndarray:
    """[..., T] bool: the tokens whose selected experts no correct port of ``profile`` can change.

    Stage-chained (the port routes the *same* h_norm): the gap between the k-th and (k+1)-th router
    logits must exceed 4·u·(|l_(k)| + |l_(k+1)|) + 1e-4, twice what rounding both logits to the
    profile's dtype moves it, plus room for float32 GEMM accumulation. End to end, the port's logits
    have also drifted with its h_norm: ``logit_drift``, the largest |Δ logit| of the correct ports
    (measured), adds twice the most it can close the gap, 4·logit_drift (docs/moe.md, "What the
    fixture cases need", bounds it a priori instead). With top_k = E every token is decided."""
    logits = np.asarray(router_logits, dtype=np.float64)
    if top_k >= logits.shape[-1]:
        return np.ones(logits.shape[:-1], dtype=bool)
    top = -np.sort(-logits, axis=-1)[..., top_k - 1: top_k + 1]
    bound = 4 * UNIT_ROUNDOFF[profile] * np.abs(top).sum(-1) + 1e-4 + 4 * logit_drift
    return top[..., 0] - top[..., 1] > bound


def moe_case(cfg, weights, x: np.ndarray, splits, case_id: str = "moe"):
    """A case of the port contract (gdncheck.harness.CaseInput) calling the layer over x [B, T, D] in
    the segments between ``splits`` (forward calls, every tensor kept)."""
    from gdncheck.harness import CaseInput

    B = x.shape[0]
    program = [{"op": "construct", "strict": False}]
    inputs = {}
    for k, (a, b) in enumerate(zip(splits[:-1], splits[1:])):
        program.append({"op": "forward", "call": k, "seq_pos": [a] * B})
        inputs[k] = np.ascontiguousarray(x[:, a:b], dtype=np.float32)
    return CaseInput(case_id, cfg.to_hf(), weights, B, program, inputs)


def by_expert(selected_experts, routing_weights):
    """(selected experts, routing weights) with each token's slots sorted by expert index: the
    routing as a set. Two correct ports may order the slots of nearly equal probabilities
    differently (nothing downstream depends on the slot order but the summation order)."""
    sel = np.asarray(selected_experts)
    order = np.argsort(sel, axis=-1, kind="stable")
    return np.take_along_axis(sel, order, -1), np.take_along_axis(np.asarray(routing_weights), order, -1)


def default_case_id(recipe: str) -> str:
    """The id of the committed default suite's case built by ``recipe`` (the id's part before ``_T``).

    Tests name cases by recipe, not by id: an id carries the case's shapes, which change whenever the
    suite's dimension mix does; the recipe names what the test needs (a decode, a snapshot, ...)."""
    import json

    from gdncheck.fixtures.manifest import DEFAULT_DIR

    cases = json.loads((DEFAULT_DIR / "manifest.json").read_text())["cases"]
    found = [c["id"] for c in cases if c["id"].split("_T", 1)[0] == recipe]
    if len(found) != 1:
        raise LookupError(f"expected one case of recipe {recipe!r} in {DEFAULT_DIR}, found {found}")
    return found[0]


#: transformers' delta-rule functions that its hub-kernel decorator binds to fla's Triton kernels when fla
#: is installed (they need a GPU driver): on the CPU a test runs transformers' own PyTorch function
TRANSFORMERS_RULES = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")
TRANSFORMERS_GDN_MODULES = ("qwen3_5.modeling_qwen3_5", "qwen3_5_moe.modeling_qwen3_5_moe",
                            "qwen3_next.modeling_qwen3_next")


def transformers_torch_rules(monkeypatch) -> None:
    """Point transformers' GDN modules at their own PyTorch delta rules (``__wrapped__``) for one test."""
    import importlib

    for name in TRANSFORMERS_GDN_MODULES:
        module = importlib.import_module(f"transformers.models.{name}")
        for fn in TRANSFORMERS_RULES:
            f = getattr(module, fn, None)
            if f is not None and hasattr(f, "__wrapped__"):
                monkeypatch.setattr(module, fn, f.__wrapped__)
