"""The stage vocabulary as the comparison engine orders it: what each stage outputs, in which order
tensors are judged, and which outputs a port must provide.

The state tensors belong to the stage that produces them: ``conv_state`` to ``conv1d`` and
``recurrent_state`` to ``delta_rule`` (they read the old state and return the new one), so a wrong
state is localised to the stage that wrote it.
"""

from __future__ import annotations

from gdncheck.stages import STAGE_INPUTS, STAGE_NAMES, STAGES, STATE_TENSORS, TENSOR_BY_NAME

STATE_PRODUCER: dict[str, str] = {"conv_state": "conv1d", "recurrent_state": "delta_rule"}

#: stage -> the tensors it returns, in its return order (state last).
STAGE_OUTPUTS: dict[str, tuple[str, ...]] = {
    s.name: tuple(t.name for t in s.tensors) + tuple(n for n, p in STATE_PRODUCER.items() if p == s.name)
    for s in STAGES
}

#: Every tensor a call produces, in pipeline order (the order first divergences are searched in).
TENSOR_ORDER: tuple[str, ...] = tuple(n for s in STAGES for n in STAGE_OUTPUTS[s.name])

#: A port must write these for every call; the other stage tensors are optional ("missing").
REQUIRED_OUTPUTS: tuple[str, ...] = ("out", "conv_state", "recurrent_state")

STATE_NAMES: tuple[str, ...] = tuple(t.name for t in STATE_TENSORS)

#: Records of state bookkeeping (seq_len) sort after every stage.
STATE_STAGE_INDEX = len(STAGES)


def stage_of(tensor: str) -> str:
    """The stage that produces ``tensor`` (states: their producer)."""
    if tensor in STATE_PRODUCER:
        return STATE_PRODUCER[tensor]
    return TENSOR_BY_NAME[tensor].stage


def stage_index(stage: str) -> int:
    return STAGE_NAMES.index(stage)


def tensor_rank(tensor: str) -> int:
    """Position of ``tensor`` in :data:`TENSOR_ORDER` (unknown names last)."""
    return TENSOR_ORDER.index(tensor) if tensor in TENSOR_ORDER else len(TENSOR_ORDER)


__all__ = ["REQUIRED_OUTPUTS", "STAGE_INPUTS", "STAGE_OUTPUTS", "STATE_NAMES", "STATE_PRODUCER", "TENSOR_ORDER",
           "stage_index", "stage_of", "tensor_rank"]
