"""The expectation after a routing tie the port resolved its own way (routing.py, docs/moe.md "Ties").

Where a port's selected set differs from the reference's only among exactly tied experts, the
tensors after the routing stage are not the golden's at those tokens: they are what the float64
reference computes with the port's experts. This module computes them from what the golden file
keeps (the layer's weights, the call's ``h_norm``, ``shared_out`` and ``h``) with the reference's own
stage functions, and only at the tied tokens; every other token keeps the golden's values, bit for
bit.

    experts_out[t] = Σ_j w_j · SwiGLU_{e_j}(h_norm[t]),  e = the port's set, w = p[e] (/ Σ p[e])
    mlp_out[t]     = experts_out[t] + shared_out[t]
    out[t]         = h[t] + mlp_out[t]
"""

from __future__ import annotations

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.experts import EXPERTS_DOWN, EXPERTS_GATE_UP, split_gate_up, stack_experts
from gdncheck.harness import call_key
from gdncheck.reference.moe import experts, moe_sum
from gdncheck.reference.residual import output

from .routing import RoutingCheck

#: The tensors after the routing stage whose expectation follows the port's experts.
DOWNSTREAM = ("experts_out", "mlp_out", "out")
#: Where the golden file keeps the layer's weights.
WEIGHTS_PREFIX = "weights."


def tie_expectations(gold, call: int, config: dict, check: RoutingCheck) -> dict[str, np.ndarray]:
    """``{name: expected}`` for :data:`DOWNSTREAM`, the golden's arrays with the tied tokens recomputed
    (float64). ``gold``: the open golden file; ``check``: the call's routing with ``any_tied``."""
    cfg = GDNConfig.from_hf(dict(config))
    golden = {name: np.array(gold.read(call_key(call, name)), dtype=np.float64)
              for name in (*DOWNSTREAM, "h_norm", "shared_out", "h")}
    weights = {name[len(WEIGHTS_PREFIX):]: np.asarray(gold.read(name), dtype=np.float64)
               for name in gold if name.startswith(WEIGHTS_PREFIX + "mlp.experts.")}
    stack_experts(cfg, weights)  # per-expert checkpoint names, if the fixture keeps those
    w_gate, w_up = split_gate_up(weights[EXPERTS_GATE_UP], cfg.moe_intermediate_size)
    w_down = weights[EXPERTS_DOWN]
    rows, tokens = np.nonzero(check.tied)
    sets = check.actual_sets[rows, tokens]  # [n, k]
    p = np.take_along_axis(check.probs[rows, tokens], sets, -1)
    if check.normalised:
        p = p / p.sum(axis=-1, keepdims=True)
    h_norm = golden["h_norm"][rows, tokens]  # [n, D]
    experts_out = experts(h_norm, p, sets, w_gate, w_up, w_down)
    mlp_out = moe_sum(experts_out, golden["shared_out"][rows, tokens])
    out = output(golden["h"][rows, tokens], mlp_out)
    expected = {name: golden[name].copy() for name in DOWNSTREAM}
    for name, value in zip(DOWNSTREAM, (experts_out, mlp_out, out)):
        expected[name][rows, tokens] = value
    return expected
