"""Differential: the implementation against the float64 reference, every stage tensor it returns
and both states after every call, judged with the profile's global bounds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from gdncheck.config import GDNConfig

from .check import assert_close
from .registry import Subject, prop, run_calls
from .strategies import InputDraw, WeightsDraw, build_inputs, build_weights, configs, input_draws, weight_draws


def consecutive_calls(x: np.ndarray, lengths: list[int], start: int = 0) -> list[tuple[np.ndarray, int]]:
    """x [B, T, D] cut into consecutive calls of ``lengths`` tokens, with their first positions."""
    calls, t = [], 0
    for n in lengths:
        calls.append((x[:, t:t + n], start + t))
        t += n
    return calls


@dataclass(frozen=True)
class Program:
    """What the differential property draws: a layer, its weights and inputs, and the calls."""

    cfg: GDNConfig
    weights: WeightsDraw
    inputs: InputDraw
    batch: int
    lengths: tuple[int, ...]

    def build(self):
        """(layer weights, calls): the arrays of the draw."""
        x = build_inputs(self.cfg, self.batch, sum(self.lengths), self.inputs)
        return build_weights(self.cfg, self.weights), consecutive_calls(x, list(self.lengths))

    def __str__(self) -> str:
        return (f"{self.cfg.summary()}, B={self.batch}, calls of {list(self.lengths)} tokens, "
                f"{self.weights!r}, {self.inputs!r}")


def draw_program(data, regime: str | None = None, kind: str | None = None) -> Program:
    """One differential program, every value drawn under its label; ``regime`` and ``kind`` fix the
    weights' regime and the inputs' kind (the tolerance derivation samples the property rows'
    observations from this same draw, stratified by both: conformance/properties/draws.py)."""
    cfg = data.draw(configs(), label="config")
    wd = data.draw(weight_draws(None if regime is None else (regime,)), label="weights")
    xd = data.draw(input_draws(None if kind is None else (kind,)), label="inputs")
    B = data.draw(st.integers(1, 2), label="batch")
    lengths = data.draw(st.lists(st.integers(1, 24), min_size=1, max_size=3), label="call lengths")
    return Program(cfg, wd, xd, B, tuple(lengths))


@prop("differential")
def differential(subject: Subject, data) -> None:
    """Every stage tensor and state of a few calls is within the profile's bound of the reference."""
    program = draw_program(data)
    weights, calls = program.build()
    _, got = run_calls(subject.make(program.cfg, weights), calls)
    _, want = run_calls(Subject.reference(program.cfg, weights), calls)
    assert_close(got, want, subject.profile, f"differential: {program}")
