"""The delta rule's defining property, checked exactly on the stage alone.

With beta = 1, no decay (g = 0) and orthonormal keys, each write stores its value under its key
without disturbing the others (``m = kᵀS`` reads 0 for a new key), so reading with ``q = k_i``
returns ``scale · v_i``. The keys are rows of a Hadamard matrix / √dk (entries ±1/2, ±1/4: exact in
every profile) and the values multiples of 1/8 below 8, so every product and sum is exact in
float32 and the expected ``core`` is exact too: the check is equality, not a tolerance.

It runs through the optional ``run_stage`` of the plug-in contract (fixtures/FORMAT.md §8); an
implementation without it is skipped, with that reason.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from gdncheck.harness import to_numpy
from gdncheck.synthetic import make_weights

from .registry import PropertySkip, Subject, prop
from .strategies import configs


def hadamard(n: int) -> np.ndarray:
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


@prop("delta_rule")
def orthonormal_recall(subject: Subject, data) -> None:
    """beta = 1, g = 0, orthonormal keys: reading with q = k_i returns scale · v_i exactly."""
    cfg = data.draw(configs(dims=(4, 16)), label="config")
    B, Hk, Hv, dk, dv, r = 1, cfg.num_k_heads, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim, cfg.head_ratio
    n = data.draw(st.integers(1, dk), label="keys written")
    seed = data.draw(st.integers(0, 2**16), label="values seed")
    rng = np.random.default_rng(seed)
    rows = rng.permutation(dk)[:n]
    signs = rng.choice([-1.0, 1.0], size=(Hk, n))
    keys = signs[:, :, None] * hadamard(dk)[rows][None] / np.sqrt(dk)  # [Hk, n, dk]
    v = rng.integers(-63, 64, size=(B, n, Hv, dv)) / 8.0
    reads = np.array([rng.integers(0, t + 1) for t in range(n)])  # token t reads a key written at or before t
    k = np.transpose(keys, (1, 0, 2))[None]  # [B, T=n, Hk, dk]
    q = k[:, reads]
    g = np.zeros((B, n, Hv))
    beta = np.ones((B, n, Hv))
    S0 = np.zeros((B, Hv, dk, dv))
    impl = subject.make(cfg, _weights_for(cfg))
    run_stage = getattr(impl, "run_stage", None)
    if run_stage is None:
        raise PropertySkip("the implementation has no run_stage(stage, inputs) (fixtures/FORMAT.md §8)")
    out = run_stage("delta_rule", {"q": q, "k": k, "v": v, "g": g, "beta": beta, "recurrent_state": S0})
    core = np.asarray(to_numpy(out["core"]), dtype=np.float64)
    expected = cfg.scale * v[:, reads]
    if not np.array_equal(core, expected):
        bad = np.argwhere(core != expected)[0]
        t, j = int(bad[1]), int(bad[2])
        raise AssertionError(
            f"core[{', '.join(map(str, bad))}] = {core[tuple(bad)]!r}, but should be exactly scale · v = "
            f"{expected[tuple(bad)]!r} ({int((core != expected).sum())} / {core.size} elements differ): token {t} "
            f"reads key {reads[t]} of key head {j // r} [orthonormal recall: {n} keys, {cfg.summary()}]")


def _weights_for(cfg):
    """Any valid weights: the stage runner needs a layer, the delta rule reads none of them."""
    return make_weights(cfg, 0)
