"""Ports that commit the field's sharding bugs (docs/sharding.md; conformance/ports/distributed.py's
TP_FAULTS and CP_FAULTS) as ``tensor_parallel`` / ``context_parallel`` methods of the port contract, for
``gdncheck run tests.ports.sharded_faults:NAME``: each must fail verify at its rank and stage. They are the
kill matrix's sharding mutants (:mod:`gdncheck.conformance.meta.sharding_mutants`), and a port without the
sharded methods."""

from __future__ import annotations

from gdncheck.conformance.meta.sharding_mutants import SHARDING_MUTANTS, sharded_port
from gdncheck.conformance.ports.implementations import reference

globals().update({m.name: sharded_port(m.name) for m in SHARDING_MUTANTS})


def unsharded(cfg, weights, **kw):
    """A port with no sharded method: the sharded cases are not applicable to it."""
    return reference(cfg, weights, **kw)
