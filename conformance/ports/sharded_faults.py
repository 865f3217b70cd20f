"""The field's sharding bugs as ports (docs/sharding.md): the reference with its ``tensor_parallel`` and
``context_parallel`` methods (docs/plugins.md) committing one fault of :data:`~.distributed.TP_FAULTS` or
:data:`~.distributed.CP_FAULTS`; the kill matrix's sharding mutants
(``gdncheck.conformance.meta.sharding_mutants``) and the tests run them."""

from __future__ import annotations

from functools import partial

import numpy as np

from gdncheck.harness.sharded import standalone_ranks
from gdncheck.sharding import CONV, A, plan_from_json

from .distributed import CP_FAULTS, TP_FAULTS, reference_context_parallel
from .implementations import reference


def _reduced_twice(partial_sum, comm):
    comm.all_reduce(partial_sum)
    comm.all_reduce(partial_sum)
    return partial_sum


def _tensor_parallel(fault: str):
    """The reference's rank program (:func:`~gdncheck.harness.sharded.standalone_ranks`) committing ``fault``
    (one of :data:`TP_FAULTS`; ``none``: the correct one)."""
    base = standalone_ranks(reference)

    def tensor_parallel(cfg, weights, plan, rank, *, profile, strict=False, **options):
        p = plan_from_json(plan, cfg)
        share = p.shares[rank]
        w = {n: np.array(weights[n], dtype=np.float32) for n in weights}
        if fault == "ranks_swapped":  # rank r builds rank world-1-r's share
            rank = p.world - 1 - rank
        if fault == "a_sliced_by_key_heads":  # ROLL PR 497: in_proj_a at the key heads' offset
            n = share.v_stop - share.v_start
            w[A][share.v_start:share.v_stop] = np.asarray(weights[A])[share.k_start:share.k_start + n]
        if fault == "conv_weight_one_block":  # the conv weight as one contiguous block per rank
            ch = share.conv_channels(cfg)
            w[CONV][ch] = np.asarray(weights[CONV])[rank * len(ch):(rank + 1) * len(ch)]
        impl = base(cfg, w, plan, rank, profile=profile, strict=strict, **options)
        if fault == "partial_not_reduced":
            impl.reduce = lambda partial_sum, comm: partial_sum
        if fault == "partial_reduced_twice":
            impl.reduce = _reduced_twice
        return impl

    return tensor_parallel


def sharded_port(fault: str):
    """The reference as a port whose sharded methods commit ``fault`` (a TP or a CP fault)."""
    if fault not in TP_FAULTS + CP_FAULTS:
        raise ValueError(f"expected a fault among {', '.join(dict.fromkeys(TP_FAULTS + CP_FAULTS))}, found {fault!r}")

    def factory(cfg, weights, **kw):
        return reference(cfg, weights, **kw)

    factory.tensor_parallel = _tensor_parallel(fault if fault in TP_FAULTS else "none")
    factory.context_parallel = partial(reference_context_parallel, fault=fault if fault in CP_FAULTS else "none")
    factory.__name__ = fault
    return factory
