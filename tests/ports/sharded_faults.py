"""Ports that commit the field's sharding bugs (docs/sharding.md; conformance/ports/distributed.py's
TP_FAULTS and CP_FAULTS; a padded rank's, PADDING_FAULTS) as ``tensor_parallel`` / ``context_parallel``
methods of the port contract, for
``gdncheck run tests.ports.sharded_faults:NAME``: each must fail verify at its rank and stage. The kill
matrix's sharding mutants run the same ports (gdncheck/conformance/ports/sharded_faults.py); a port
padded as vLLM PR 47759 pads, correctly (``padded_inert``); and a port without the sharded methods."""

from __future__ import annotations

from gdncheck.conformance.ports.distributed import CP_FAULTS, TP_FAULTS
from gdncheck.conformance.ports.implementations import reference
from gdncheck.conformance.ports.sharded_faults import PADDING_FAULTS, padded_port, sharded_port

globals().update({f: sharded_port(f) for f in (*TP_FAULTS, *CP_FAULTS, *PADDING_FAULTS) if f != "none"})

#: each rank padded to max(counts) head slots (vLLM PR 47759), the padding inert: conforms
padded_inert = padded_port("zero")


def unsharded(cfg, weights, **kw):
    """A port with no sharded method: the sharded cases are not applicable to it."""
    return reference(cfg, weights, **kw)


def raises_on_rank_2(cfg, weights, **kw):
    """A port whose context-parallel rank 2 raises after the others entered their first collective."""
    return reference(cfg, weights, **kw)


def _raise_on_rank_2(cfg, weights, plan, rank, comm, xs, conv_state, recurrent_state, **options):
    if rank == 2:
        raise RuntimeError("rank 2 gives up")
    return reference.context_parallel(cfg, weights, plan, rank, comm, xs, conv_state, recurrent_state, **options)


raises_on_rank_2.context_parallel = _raise_on_rank_2

