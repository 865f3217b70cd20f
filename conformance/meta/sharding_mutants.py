"""The field's sharding bugs as mutants (issue 41 item 5; docs/sharding.md, docs/meta.md "Sharding
faults"): the reference port with its ``tensor_parallel`` and ``context_parallel`` methods
(docs/plugins.md), one fault each, run on the sharded cases (tag ``sharded``) only. A tensor-parallel
fault leaves the context-parallel cases right, and the other way round. Every one is a plug-in factory::

    gdncheck run gdncheck.conformance.meta.sharding_mutants:partial_not_reduced --tag sharded --out out/
"""

from __future__ import annotations

from dataclasses import dataclass

from gdncheck.conformance.ports.sharded_faults import sharded_port

from .mutants import TaggedMutant

SHARDED = "sharded"


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
    _m("padding_head_leaks", "out_proj", 0, "an uneven plan's padding slot leaking into out_proj (vLLM PR 47759)",
       "tp3-uneven"),
)
SHARDING_MUTANT_BY_NAME = {m.name: m for m in SHARDING_MUTANTS}

# module-level factories, so that `gdncheck run gdncheck.conformance.meta.sharding_mutants:NAME` works
globals().update({m.name: sharded_port(m.name) for m in SHARDING_MUTANTS})
