"""Stage 11, `mlp`, sparse variant: the mixture-of-experts block of Qwen3.5-MoE and Qwen3-Next.

Four stages, each a plain function (tensor names: gdncheck/stages.py `MOE_STAGES`), then their sum:

    router         router_logits    = h_norm W_routerᵀ
    routing        routing_weights, selected_experts   (softmax, top-k, renormalise)
    experts        experts_out      = Σ_j routing_weights[j] · SwiGLU_{selected_experts[j]}(h_norm)
    shared_expert  shared_out       = sigmoid(h_norm w_sgᵀ) · SwiGLU_shared(h_norm)
    mlp            mlp_out          = experts_out + shared_out   (`moe_sum`)

`mlp_moe` runs them in this order and returns every tensor. Each SwiGLU is the dense MLP of
reference/mlp.py with that expert's weights. Top-k order: descending probability, exact ties to
the lower expert index (a stable sort; `torch.topk` promises none). The sources and why the tie
rule: docs/moe.md, "The reference" and "Ties".
"""

from __future__ import annotations

import numpy as np

from . import arith
from .arith import matmul
from .functions import f64, sigmoid
from .mlp import mlp


def router(h_norm: np.ndarray, w_router: np.ndarray) -> np.ndarray:
    """router_logits = h_norm W_routerᵀ.

    h_norm: [..., T, D]; W_router: [E, D] (``mlp.gate.weight``). Returns router_logits [..., T, E].
    """
    return matmul(f64(h_norm), f64(w_router).T)


def router_probs(router_logits: np.ndarray) -> np.ndarray:
    """p = softmax(router_logits) over the experts: exp(l − max l) / Σ_e exp(l_e − max l).

    router_logits: [..., E]. Returns p [..., E] (the shift by the row's max changes nothing but the
    range of exp).
    """
    l = f64(router_logits)
    p = arith.exp(l - l.max(axis=-1, keepdims=True))
    p /= arith.sum_last(p)
    return p


def routing(
    router_logits: np.ndarray, top_k: int, norm_topk_prob: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """selected_experts = the top_k experts by p = softmax(router_logits), in descending p, exact
    ties to the lower expert index; routing_weights = p[selected] / Σ p[selected] (norm_topk_prob),
    else p[selected].

    router_logits: [..., T, E]. Returns routing_weights [..., T, top_k] (float64) and
    selected_experts [..., T, top_k] (int64), slot j holding the (j+1)-th largest probability.
    """
    p = router_probs(router_logits)
    # a stable sort of −p keeps equal probabilities in index order: the lower index first
    selected = np.argsort(-p, axis=-1, kind="stable")[..., :top_k]
    weights = np.take_along_axis(p, selected, axis=-1)
    if norm_topk_prob:
        weights = weights / arith.sum_last(weights)
    return weights, selected.astype(np.int64)


def experts(
    h_norm: np.ndarray,
    routing_weights: np.ndarray,
    selected_experts: np.ndarray,
    w_gate: np.ndarray,
    w_up: np.ndarray,
    w_down: np.ndarray,
) -> np.ndarray:
    """experts_out[t] = Σ_j routing_weights[t, j] · mlp(h_norm[t]; W_gate[e], W_up[e], W_down[e]),
    e = selected_experts[t, j], mlp the dense SwiGLU of reference/mlp.py.

    h_norm: [..., T, D]; routing_weights, selected_experts: [..., T, top_k]; W_gate, W_up:
    [E, I_moe, D]; W_down: [E, D, I_moe]. Returns experts_out [..., T, D].

    The same sum, grouped: each expert runs once, on the tokens that chose it, and adds its
    weighted output to theirs (experts in index order; a token chooses an expert at most once).
    """
    x = f64(h_norm)
    lead, D = x.shape[:-1], x.shape[-1]
    x = x.reshape(-1, D)
    k = selected_experts.shape[-1]
    slots = np.asarray(selected_experts).reshape(-1)  # slot s belongs to token s // k
    weights = f64(routing_weights).reshape(-1)
    out = np.zeros_like(x)
    order = np.argsort(slots, kind="stable")
    counts = np.bincount(slots, minlength=w_gate.shape[0])
    start = 0
    for e in np.flatnonzero(counts):
        chosen = order[start : start + counts[e]]
        start += counts[e]
        tokens = chosen // k
        y = mlp(x[tokens], w_gate[e], w_up[e], w_down[e])
        y *= weights[chosen, None]
        out[tokens] += y
    return out.reshape(*lead, D)


def shared_expert(
    h_norm: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray, w_shared_expert_gate: np.ndarray
) -> np.ndarray:
    """shared_out = sigmoid(h_norm w_sgᵀ) · mlp(h_norm; W_gate, W_up, W_down).

    h_norm: [..., T, D]; W_gate, W_up: [I_shared, D]; W_down: [D, I_shared]; w_sg: [1, D]
    (``mlp.shared_expert_gate.weight``). Returns shared_out [..., T, D]; the gate is one scalar
    per token.
    """
    x = f64(h_norm)
    out = mlp(x, w_gate, w_up, w_down)
    out *= sigmoid(matmul(x, f64(w_shared_expert_gate).T))
    return out


def moe_sum(experts_out: np.ndarray, shared_out: np.ndarray) -> np.ndarray:
    """mlp_out = experts_out + shared_out: stage ``mlp`` of a layer with the sparse block.

    experts_out, shared_out: [..., T, D]. Returns mlp_out [..., T, D].
    """
    return f64(experts_out) + f64(shared_out)


def mlp_moe(
    h_norm: np.ndarray,
    w_router: np.ndarray,
    w_gate: np.ndarray,
    w_up: np.ndarray,
    w_down: np.ndarray,
    w_shared_gate: np.ndarray,
    w_shared_up: np.ndarray,
    w_shared_down: np.ndarray,
    w_shared_expert_gate: np.ndarray,
    top_k: int,
    norm_topk_prob: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The sparse block: router, routing, experts, shared_expert, then mlp_out = experts_out + shared_out.

    Shapes as in the stage functions above (experts stacked: W_gate, W_up [E, I_moe, D], W_down
    [E, D, I_moe]). Returns (router_logits, routing_weights, selected_experts, experts_out,
    shared_out, mlp_out).
    """
    router_logits = router(h_norm, w_router)
    routing_weights, selected_experts = routing(router_logits, top_k, norm_topk_prob)
    experts_out = experts(h_norm, routing_weights, selected_experts, w_gate, w_up, w_down)
    shared_out = shared_expert(h_norm, w_shared_gate, w_shared_up, w_shared_down, w_shared_expert_gate)
    return router_logits, routing_weights, selected_experts, experts_out, shared_out, moe_sum(experts_out, shared_out)


def routing_margin(router_logits: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """How far each token's routing is from a tie: p_(k) − p_(k+1) and l_(k) − l_(k+1), the gaps
    between its k-th and (k+1)-th largest router probabilities and logits (∞ when top_k = E).

    router_logits: [..., T, E]. Returns (prob_margin, logit_margin), each [..., T]. A rounding that
    moves two logits by less than logit_margin / 2 each cannot change the selected set.
    """
    l = f64(router_logits)
    if top_k >= l.shape[-1]:
        inf = np.full(l.shape[:-1], np.inf)
        return inf, inf.copy()
    top = -np.sort(-l, axis=-1)[..., top_k - 1 : top_k + 1]
    p = router_probs(l)
    ptop = -np.sort(-p, axis=-1)[..., top_k - 1 : top_k + 1]
    return ptop[..., 0] - ptop[..., 1], top[..., 0] - top[..., 1]
