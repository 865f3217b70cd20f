"""Ports that commit the field's sharding bugs (docs/sharding.md; conformance/ports/distributed.py's
TP_FAULTS and CP_FAULTS) as ``tensor_parallel`` / ``context_parallel`` methods of the port contract, for
``gdncheck run tests.ports.sharded_faults:NAME``: each must fail verify at its rank and stage."""

from __future__ import annotations

from functools import partial

import numpy as np

from gdncheck.conformance.ports.distributed import reference_context_parallel
from gdncheck.conformance.ports.implementations import reference
from gdncheck.harness.sharded import standalone_ranks
from gdncheck.sharding import CONV, A, plan_from_json


def _twice(partial_sum, comm):
    comm.all_reduce(partial_sum)
    comm.all_reduce(partial_sum)
    return partial_sum


def _tensor_parallel(fault: str):
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
            impl.reduce = _twice
        return impl

    return tensor_parallel


def _port(fault: str):
    def factory(cfg, weights, **kw):
        return reference(cfg, weights, **kw)

    factory.tensor_parallel = _tensor_parallel(fault)
    factory.context_parallel = partial(reference_context_parallel, fault=fault)
    return factory


partial_not_reduced = _port("partial_not_reduced")
partial_reduced_twice = _port("partial_reduced_twice")
ranks_swapped = _port("ranks_swapped")
a_sliced_by_key_heads = _port("a_sliced_by_key_heads")
conv_weight_one_block = _port("conv_weight_one_block")
no_halo = _port("no_halo")
entry_from_zeros = _port("entry_from_zeros")
summaries_reversed = _port("summaries_reversed")
decay_on_both = _port("decay_on_both")


def unsharded(cfg, weights, **kw):
    """A port with no sharded method: the sharded cases are not applicable to it."""
    return reference(cfg, weights, **kw)
