"""The field's sharding bugs as mutants (issue 41 item 5; docs/sharding.md, docs/meta.md "Sharding
faults"): the reference port with its ``tensor_parallel`` and ``context_parallel`` methods
(docs/plugins.md), one fault each, run on the sharded cases (tag ``sharded``) only. A tensor-parallel
fault leaves the context-parallel cases right, and the other way round. Every one is a plug-in factory::

    gdncheck run gdncheck.conformance.meta.sharding_mutants:partial_not_reduced --tag sharded --out out/
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from gdncheck.conformance.ports.distributed import CP_FAULTS, TP_FAULTS, reference_context_parallel
from gdncheck.conformance.ports.implementations import reference
from gdncheck.harness.sharded import standalone_ranks
from gdncheck.sharding import CONV, A, plan_from_json

from .mutants import TaggedMutant

SHARDED = "sharded"


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


@dataclass(frozen=True)
class ShardingMutant(TaggedMutant):
    """A sharding fault: its factory is :func:`sharded_port` (``cls`` unused); ``rank`` the rank verify
    must name first."""

    rank: int = 0
    module: str = "gdncheck.conformance.meta.sharding_mutants"

    @property
    def factory(self):
        return sharded_port(self.name)


def _m(name: str, stage: str, rank: int, bug_class: str, recipe: str) -> ShardingMutant:
    call = 1 if recipe.startswith("cp") else 0  # a context-parallel case's split call follows its prefill
    return ShardingMutant(name, object, stage, (recipe, call), bug_class=bug_class, case_tags=(SHARDED,),
                          rank=rank)


#: Each with the stage (and, on its case, the call) where verify must first see it and the rank it names.
SHARDING_MUTANTS: tuple[ShardingMutant, ...] = (
    _m("partial_not_reduced", "out_proj", 0, "out_proj partials not all-reduced", "tp2"),
    _m("partial_reduced_twice", "out_proj", 0, "out_proj partials all-reduced twice", "tp2"),
    _m("ranks_swapped", "in_proj", 0, "ranks swapped (a rank computes another's share)", "tp2"),
    _m("a_sliced_by_key_heads", "gates", 1, "a gate tensor sliced at the key heads (ROLL PR 497)", "tp2"),
    _m("conv_weight_one_block", "conv1d", 0, "conv weight split as one block, not per q/k/v segment", "tp2"),
    _m("no_halo", "conv1d", 1, "context parallelism without the conv halo", "cp4-zigzag"),
    _m("entry_from_zeros", "delta_rule", 1, "a rank entering from zeros, not its predecessors' state", "cp4-zigzag"),
    _m("summaries_reversed", "delta_rule", 2, "state summaries composed out of token order (zigzag)", "cp4-zigzag"),
    _m("decay_on_both", "delta_rule", 0, "a summary's decay on both terms (shainet PR 170)", "cp2-ragged"),
)
SHARDING_MUTANT_BY_NAME = {m.name: m for m in SHARDING_MUTANTS}

# module-level factories, so that `gdncheck run gdncheck.conformance.meta.sharding_mutants:NAME` works
globals().update({m.name: sharded_port(m.name) for m in SHARDING_MUTANTS})
