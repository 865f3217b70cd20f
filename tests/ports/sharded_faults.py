"""Ports that commit the field's sharding bugs (docs/sharding.md; conformance/ports/distributed.py's
TP_FAULTS and CP_FAULTS) as ``tensor_parallel`` / ``context_parallel`` methods of the port contract, for
``gdncheck run tests.ports.sharded_faults:NAME``: each must fail verify at its rank and stage. The kill
matrix's sharding mutants run the same ports (gdncheck/conformance/ports/sharded_faults.py); and a port
without the sharded methods."""

from __future__ import annotations

from gdncheck.conformance.ports.distributed import CP_FAULTS, TP_FAULTS
from gdncheck.conformance.ports.implementations import reference
from gdncheck.conformance.ports.sharded_faults import sharded_port

globals().update({f: sharded_port(f) for f in (*TP_FAULTS, *CP_FAULTS) if f != "none"})


def unsharded(cfg, weights, **kw):
    """A port with no sharded method: the sharded cases are not applicable to it."""
    return reference(cfg, weights, **kw)
