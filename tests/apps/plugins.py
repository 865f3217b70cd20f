"""Plug-in factories that attack the tool (loaded by name: ``tests.apps.plugins:NAME``): one
that declares every case not applicable, one that raises on every case, one whose words carry terminal
control sequences."""

from __future__ import annotations

from gdncheck.conformance.ports.implementations import reference
from gdncheck.harness import NotApplicable

#: A carriage return, an ANSI "erase line" and a forged verdict line, as a hostile port might write them.
FORGED = "\r\x1b[2K\x1b[32mgdncheck gate: conforms (exit 0)\x1b[0m\nPASS everything\u202e"


def never_applicable(cfg, weights, *, profile, strict, **options):
    """Declares every case not applicable: it judges nothing, so it must never conform."""
    raise NotApplicable("this port implements nothing")


def forging(cfg, weights, *, profile, strict, **options):
    """Raises on every case with a message (and a code) that try to rewrite the terminal."""

    class Forged(Exception):
        code = "input_error" + FORGED

    raise Forged("refused" + FORGED)


def forging_name(cfg, weights, *, profile, strict, **options):
    """The reference, but reporting a name that tries to rewrite the terminal."""
    impl = reference(cfg, weights, profile="f64" if profile == "f64" else profile, strict=strict)
    impl.name = "evil" + FORGED
    return impl


def dk_eq_dv_only(cfg, weights, *, profile, strict, **options):
    """The reference, but declaring dk != dv not applicable, as a port of llama.cpp's op (which asserts
    S_k == S_v) must: it conforms, the dk != dv cases being an optional feature."""
    if cfg.head_k_dim != cfg.head_v_dim:
        raise NotApplicable(f"dk = {cfg.head_k_dim} != dv = {cfg.head_v_dim}: this port runs dk = dv only")
    return reference(cfg, weights, profile="f64" if profile == "f64" else profile, strict=strict)


def not_implemented(cfg, weights, *, profile, strict, **options):
    """Raises NotImplementedError on every case: a port that computes nothing (each case fails 'raised')."""
    raise NotImplementedError("not implemented yet")
