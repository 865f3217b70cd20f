"""The registry of properties and the implementation under test (the *subject*).

A property is a plain function ``fn(subject, data)`` that draws what it needs from Hypothesis'
``data`` (every draw labelled) and raises ``AssertionError`` with a message in the suite's grammar
when the implementation breaks it. :func:`prop` registers it under its function name; the runner
(:mod:`.runner`) wraps it in ``@given`` with the chosen settings.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.conformance.ports.plugin import load_factory
from gdncheck.errors import GDNError
from gdncheck.fixtures.reference_impl import reference_f64
from gdncheck.harness import to_numpy
from gdncheck.profiles import VERIFY_PROFILES
from gdncheck.weights import LayerWeights

CHAPTERS = ("differential", "metamorphic", "delta_rule", "state", "errors", "serving")


class PropertySkip(Exception):
    """The property does not apply to this implementation (the message says why)."""


@dataclass(frozen=True)
class Property:
    name: str
    chapter: str
    fn: Callable[[Subject, Any], None]
    once: bool  # profile-independent: the gate runs it in one profile only
    doc: str


PROPERTIES: dict[str, Property] = {}


def prop(chapter: str, *, once: bool = False):
    """Register ``fn(subject, data)`` as a property of ``chapter``."""
    if chapter not in CHAPTERS:
        raise ValueError(f"chapter must be one of {CHAPTERS}, found {chapter!r}")

    def register(fn):
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else fn.__name__
        PROPERTIES[fn.__name__] = Property(fn.__name__, chapter, fn, once, doc)
        return fn

    return register


@dataclass
class Subject:
    """The implementation under test in one profile, and the float64 reference beside it."""

    spec: str
    profile: str
    factory: Callable = field(repr=False)

    def make(self, cfg: GDNConfig, weights: Mapping[str, np.ndarray], *, strict: bool = False, **options):
        w = weights if isinstance(weights, LayerWeights) else LayerWeights(weights, config=cfg)
        return self.factory(cfg, w, profile=self.profile, strict=strict, **options)

    @staticmethod
    def reference(cfg: GDNConfig, weights: Mapping[str, np.ndarray]):
        w = weights if isinstance(weights, LayerWeights) else LayerWeights(weights, config=cfg)
        return reference_f64(cfg, w)

    def env(self) -> str:
        return f"GDN_IMPL={self.spec} GDN_PROFILE={self.profile}"


def subject_from_env(impl: str | None = None, profile: str | None = None) -> Subject:
    """The subject named by the arguments, else by ``GDN_IMPL`` / ``GDN_PROFILE``."""
    spec = impl or os.environ.get("GDN_IMPL") or "reference"
    profile = profile or os.environ.get("GDN_PROFILE") or "f32"
    if profile not in VERIFY_PROFILES:
        raise GDNError(f"expected GDN_PROFILE one of {', '.join(VERIFY_PROFILES)}, found {profile!r}")
    return Subject(spec, profile, load_factory(spec))


def run_calls(impl, calls: list[tuple[np.ndarray, Any]], state=None, batch: int | None = None):
    """Run ``(x, seq_pos)`` calls in order on ``impl``; return ``(state, outputs)`` with one dict per
    call: every stage tensor the implementation returned (NumPy float64, ``out`` always) and the
    state arrays after the call."""
    if state is None:
        state = impl.new_state(batch if batch is not None else calls[0][0].shape[0])
    outs = []
    for x, pos in calls:
        B = x.shape[0]
        seq_pos = np.broadcast_to(np.asarray(pos, dtype=np.int64), (B,)).copy()
        out, trace = impl.forward(x, state, seq_pos)
        d = {k: np.array(to_numpy(v), dtype=np.float64) for k, v in trace.items()}
        d["out"] = np.array(to_numpy(out), dtype=np.float64)
        for k, v in impl.state_arrays(state).items():
            d[k] = np.array(to_numpy(v), dtype=np.float64)
        outs.append(d)
    return state, outs
