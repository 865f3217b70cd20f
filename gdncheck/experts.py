"""The weights of the sparse mixture-of-experts MLP block (Qwen3.5-MoE, Qwen3-Next): names, shapes,
and the conversion of a checkpoint's per-expert tensors to the one canonical, stacked form.

Neutral: no math. The canonical form is transformers' in-memory one (`Qwen3_5MoeExperts`), names
without the layer prefix: `mlp.gate.weight` [E, D], `mlp.experts.gate_up_proj` [E, 2·I_moe, D]
(gate rows, then up), `mlp.experts.down_proj` [E, D, I_moe], the shared expert's
`gate_proj`/`up_proj` [I_shared, D], `down_proj` [D, I_shared] and `mlp.shared_expert_gate.weight`
[1, D]. Checkpoints store `mlp.experts.{e}.gate_proj|up_proj|down_proj.weight` one by one:
`stack_experts` converts them, `unstack_experts` the reverse.

The table with each weight's use: docs/moe.md, "Weights and checkpoints".
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping

import numpy as np

from .config import GDNConfig
from .errors import ExpertLayoutError, MissingExpertError, WeightShapeError

ROUTER = "mlp.gate.weight"
EXPERTS_GATE_UP = "mlp.experts.gate_up_proj"
EXPERTS_DOWN = "mlp.experts.down_proj"
SHARED_GATE = "mlp.shared_expert.gate_proj.weight"
SHARED_UP = "mlp.shared_expert.up_proj.weight"
SHARED_DOWN = "mlp.shared_expert.down_proj.weight"
SHARED_EXPERT_GATE = "mlp.shared_expert_gate.weight"

#: The canonical weights of the sparse block, in the order of the table above.
MOE_WEIGHT_NAMES: tuple[str, ...] = (
    ROUTER, EXPERTS_GATE_UP, EXPERTS_DOWN, SHARED_GATE, SHARED_UP, SHARED_DOWN, SHARED_EXPERT_GATE,
)

EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
PER_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def expert_name(e: int, projection: str) -> str:
    """The checkpoint name of expert ``e``'s ``projection`` (``gate_proj``, ``up_proj``, ``down_proj``)."""
    return f"mlp.experts.{e}.{projection}.weight"


def moe_expected_shapes(cfg: GDNConfig) -> dict[str, tuple[int, ...]]:
    E, D, Im, Is = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
    return {
        ROUTER: (E, D),
        EXPERTS_GATE_UP: (E, 2 * Im, D),
        EXPERTS_DOWN: (E, D, Im),
        SHARED_GATE: (Is, D),
        SHARED_UP: (Is, D),
        SHARED_DOWN: (D, Is),
        SHARED_EXPERT_GATE: (1, D),
    }


#: What each canonical shape is made of, for the error messages.
SHAPE_WORDS = {
    ROUTER: "[num_experts, hidden_size]",
    EXPERTS_GATE_UP: "[num_experts, 2 * moe_intermediate_size, hidden_size]",
    EXPERTS_DOWN: "[num_experts, hidden_size, moe_intermediate_size]",
    SHARED_GATE: "[shared_expert_intermediate_size, hidden_size]",
    SHARED_UP: "[shared_expert_intermediate_size, hidden_size]",
    SHARED_DOWN: "[hidden_size, shared_expert_intermediate_size]",
    SHARED_EXPERT_GATE: "[1, hidden_size]",
}


def stack_experts(
    cfg: GDNConfig,
    arrays: MutableMapping[str, np.ndarray],
    stored: MutableMapping[str, str] | None = None,
    layer: int | None = None,
) -> None:
    """Per-expert ``mlp.experts.{e}.*.weight`` -> ``mlp.experts.gate_up_proj`` / ``down_proj`` (in place).

    Nothing to do when ``arrays`` holds no per-expert tensor. Refused, naming the tensor: a layout
    mixing both forms, an expert index ≥ ``num_experts``, a missing expert projection, a per-expert
    shape other than [I_moe, D] (gate, up) or [D, I_moe] (down). ``stored`` (name -> stored dtype)
    is updated: the stacked tensors get their experts' dtype (``+``-joined if they differ).
    """
    found: dict[tuple[int, str], str] = {}
    for name in list(arrays):
        m = PER_EXPERT.match(name)
        if m:
            found[(int(m.group(1)), m.group(2))] = name
    if not found:
        return
    both = [n for n in (EXPERTS_GATE_UP, EXPERTS_DOWN) if n in arrays]
    if both:
        raise ExpertLayoutError(
            f"expected the experts in one layout, per-expert (mlp.experts.{{e}}.*.weight) or stacked "
            f"({EXPERTS_GATE_UP}, {EXPERTS_DOWN}), found both ({len(found)} per-expert tensors and {both[0]})",
            layer=layer, name=both[0],
        )
    E, D, Im = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    beyond = sorted(e for e, _ in found if e >= E)
    if beyond:
        raise ExpertLayoutError(
            f"config declares num_experts={E} (experts 0..{E - 1}), found tensors of expert {beyond[0]}"
            + (f" (and {len(set(beyond)) - 1} more expert indices beyond)" if len(set(beyond)) > 1 else ""),
            layer=layer, name=next(n for (e, _), n in sorted(found.items()) if e == beyond[0]),
        )
    missing = [expert_name(e, p) for e in range(E) for p in EXPERT_PROJECTIONS if (e, p) not in found]
    if missing:
        raise MissingExpertError(
            f"expected {E} experts x {len(EXPERT_PROJECTIONS)} projections, missing {len(missing)}: "
            + ", ".join(missing[:6]) + (", ..." if len(missing) > 6 else ""),
            layer=layer, name=missing[0],
        )
    want = {"gate_proj": (Im, D), "up_proj": (Im, D), "down_proj": (D, Im)}
    for (_, p), name in sorted(found.items()):
        shape = tuple(np.shape(arrays[name]))
        if shape != want[p]:
            words = "[moe_intermediate_size, hidden_size]" if p != "down_proj" else \
                "[hidden_size, moe_intermediate_size]"
            raise WeightShapeError(f"expected expert shape {list(want[p])} {words}, found {list(shape)}",
                                   layer=layer, name=name)
    dtype = np.result_type(*(arrays[n].dtype for n in found.values()))
    gate_up = np.empty((E, 2 * Im, D), dtype=dtype)
    down = np.empty((E, D, Im), dtype=dtype)
    for e in range(E):
        gate_up[e, :Im] = arrays.pop(expert_name(e, "gate_proj"))
        gate_up[e, Im:] = arrays.pop(expert_name(e, "up_proj"))
        down[e] = arrays.pop(expert_name(e, "down_proj"))
    arrays[EXPERTS_GATE_UP] = gate_up
    arrays[EXPERTS_DOWN] = down
    if stored is not None:
        kinds = {p: sorted({stored.pop(found[(e, p)], "?") for e in range(E)}) for p in EXPERT_PROJECTIONS}
        stored[EXPERTS_GATE_UP] = "+".join(sorted(set(kinds["gate_proj"]) | set(kinds["up_proj"])))
        stored[EXPERTS_DOWN] = "+".join(kinds["down_proj"])


def unstack_experts(cfg: GDNConfig, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The reverse of :func:`stack_experts`: canonical weights -> per-expert checkpoint names."""
    out = {k: v for k, v in weights.items() if k not in (EXPERTS_GATE_UP, EXPERTS_DOWN)}
    gate_up, down, Im = weights[EXPERTS_GATE_UP], weights[EXPERTS_DOWN], cfg.moe_intermediate_size
    for e in range(gate_up.shape[0]):
        out[expert_name(e, "gate_proj")] = np.ascontiguousarray(gate_up[e, :Im])
        out[expert_name(e, "up_proj")] = np.ascontiguousarray(gate_up[e, Im:])
        out[expert_name(e, "down_proj")] = np.ascontiguousarray(down[e])
    return out


def mlp_kind_of(weights: Mapping[str, object]) -> str:
    """The MLP block a layer's canonical weights hold: ``"moe"`` when they carry the router
    (``mlp.gate.weight``), else ``"dense"``. For callers that hold one layer's weights and no layer
    index (a fixture case, a stage runner); ``GDNConfig.mlp_kind(layer)`` is the config's answer, and
    ``validate_weights`` refuses weights that contradict it."""
    return "moe" if ROUTER in weights else "dense"


def split_gate_up(gate_up: np.ndarray, moe_intermediate_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Views W_gate [E, I_moe, D] and W_up [E, I_moe, D] of the stacked ``gate_up_proj``."""
    return gate_up[:, :moe_intermediate_size], gate_up[:, moe_intermediate_size:]
