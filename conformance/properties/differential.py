"""Differential: the implementation against the float64 reference, every stage tensor it returns
and both states after every call, judged with the profile's global bounds."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from .check import assert_close
from .registry import Subject, prop, run_calls
from .strategies import build_inputs, build_weights, configs, input_draws, weight_draws


def consecutive_calls(x: np.ndarray, lengths: list[int], start: int = 0) -> list[tuple[np.ndarray, int]]:
    """x [B, T, D] cut into consecutive calls of ``lengths`` tokens, with their first positions."""
    calls, t = [], 0
    for n in lengths:
        calls.append((x[:, t:t + n], start + t))
        t += n
    return calls


@prop("differential")
def differential(subject: Subject, data) -> None:
    """Every stage tensor and state of a few calls is within the profile's bound of the reference."""
    cfg = data.draw(configs(), label="config")
    wd = data.draw(weight_draws(), label="weights")
    xd = data.draw(input_draws(), label="inputs")
    B = data.draw(st.integers(1, 2), label="batch")
    lengths = data.draw(st.lists(st.integers(1, 24), min_size=1, max_size=3), label="call lengths")
    weights = build_weights(cfg, wd)
    calls = consecutive_calls(build_inputs(cfg, B, sum(lengths), xd), lengths)
    _, got = run_calls(subject.make(cfg, weights), calls)
    _, want = run_calls(Subject.reference(cfg, weights), calls)
    assert_close(got, want, subject.profile, f"differential: {cfg.summary()}, B={B}, calls of {lengths} tokens, "
                                             f"{wd!r}, {xd!r}")
