"""Factories of correct low-precision implementations in each rounding placement (the precision
emulation of conformance/earn/emulate.py), for GDN_IMPL=tests.properties.placements:NAME."""

from __future__ import annotations

from gdncheck.conformance.ports.implementations import reference


def hf(cfg, weights, **kw):
    return reference(cfg, weights, placement="hf", **kw)


def fla(cfg, weights, **kw):
    return reference(cfg, weights, placement="fla", **kw)


def fp32_once(cfg, weights, **kw):
    return reference(cfg, weights, placement="fp32_once", **kw)


def metrale(cfg, weights, **kw):
    return reference(cfg, weights, placement="metrale", **kw)
