"""Mutants of the sparse mixture-of-experts block: the correct emulated layer
(:class:`~gdncheck.conformance.earn.emulate.EmulatedLayer`) on a sparse layer with one known bug each
(issue 15, item 7; docs/moe.md, "Bug classes"). Each overrides one stage method of the block
(:mod:`gdncheck.conformance.earn.emulate_moe`).

Each is a :class:`MoEMutant`: the stage where ``verify`` must first see it, and the fixture tags a case
needs to show it (:attr:`MoEMutant.case_tags`): every one needs a sparse layer (tag ``moe``), and
:class:`SoftmaxAfterTopK` a block that does not renormalise (``norm_topk_prob`` false, Qwen3-Next;
tag ``no-renorm``), because with the renormalisation it computes the very same weights. The kill
matrix runs each on the cases with its tags, and says so where the suite has none. Every mutant is
also a plug-in factory::

    gdncheck run gdncheck.conformance.meta.moe_mutants:shared_gate_without_sigmoid --profile bf16 --out out/
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gdncheck.conformance.earn import lowp
from gdncheck.conformance.earn.emulate import EmulatedLayer
from gdncheck.conformance.earn.lowp import f32
from gdncheck.experts import EXPERTS_GATE_UP, SHARED_DOWN, SHARED_EXPERT_GATE, SHARED_GATE, SHARED_UP
from gdncheck.fixtures.manifest import load_manifest

from .mutants import Mutant

MODULE = "gdncheck.conformance.meta.moe_mutants"


class SoftmaxAfterTopK(EmulatedLayer):
    """The top_k experts taken by their logits, then the softmax over those k logits only (Mixtral's
    order), instead of the softmax over every expert before the top-k. The selection is the same
    (softmax is monotone), and with the renormalisation so are the weights (p_j / Σ_sel p =
    e^l_j / Σ_sel e^l); without it the weights should be p[selected], summing to less than 1, and
    these sum to 1."""

    def routing(self, router_logits):
        k, l = self.cfg.num_experts_per_tok, f32(router_logits)
        selected = np.argsort(-l, axis=-1, kind="stable")[..., :k]
        top = np.take_along_axis(l, selected, axis=-1)
        z = np.exp(top - top.max(axis=-1, keepdims=True))
        weights = z / lowp.sum_last(z, self.order)
        if self.moe_rounding.weights_stored:
            weights = self.store(weights)
        return weights, selected.astype(np.int64)


class NotRenormalised(EmulatedLayer):
    """The routing weights left as p[selected] where the block renormalises them (norm_topk_prob
    dropped, or Qwen2-MoE's default carried over)."""

    def routing(self, router_logits):
        return self.route(router_logits, renormalise=False)


class SharedGateWithoutSigmoid(EmulatedLayer):
    """The shared expert scaled by its raw gate logit, the sigmoid forgotten."""

    def shared_expert(self, h_norm):
        x = f32(h_norm)
        act = self._swiglu(x, self.w[SHARED_GATE], self.w[SHARED_UP])
        down = self.store(self.matmul_t(act, self.w[SHARED_DOWN]))
        return self.store(self.store(self.matmul_t(x, self.w[SHARED_EXPERT_GATE])) * down)


class SharedExpertDropped(EmulatedLayer):
    """No shared expert: mlp_out is the routed experts' output alone (a port written for a MoE without
    one, as Mixtral). It has no shared_out to hand out."""

    def shared_expert(self, h_norm):
        return None

    def moe_sum(self, experts_out, shared_out):
        return self.store(f32(experts_out))


class ExpertGateUpSwapped(EmulatedLayer):
    """The stacked ``gate_up_proj`` read as [up | gate] instead of [gate | up]: silu(up) · gate."""

    def prepare_moe(self) -> None:
        Im = self.cfg.moe_intermediate_size
        gate_up = self.w[EXPERTS_GATE_UP]
        self.w_expert_gate, self.w_expert_up = gate_up[:, Im:], gate_up[:, :Im]


@dataclass(frozen=True)
class MoEMutant(Mutant):
    """A :class:`~.mutants.Mutant` of the sparse block, shown only by cases with ``case_tags``."""

    case_tags: tuple[str, ...] = ("moe",)
    module: str = MODULE  # where its plug-in factory lives (``gdncheck run MODULE:NAME``)


MOE_MUTANTS: tuple[MoEMutant, ...] = (
    MoEMutant("softmax_after_topk", SoftmaxAfterTopK, "routing", bug_class="softmax after top-k instead of before",
              case_tags=("moe", "no-renorm")),
    MoEMutant("routing_not_renormalised", NotRenormalised, "routing", bug_class="routing weights not renormalised"),
    MoEMutant("shared_gate_without_sigmoid", SharedGateWithoutSigmoid, "shared_expert",
              bug_class="shared-expert gate without its sigmoid"),
    MoEMutant("shared_expert_dropped", SharedExpertDropped, "mlp", bug_class="shared expert dropped"),
    MoEMutant("expert_gate_up_swapped", ExpertGateUpSwapped, "experts", bug_class="expert gate/up swapped"),
)
MOE_MUTANT_BY_NAME = {m.name: m for m in MOE_MUTANTS}


def tagged_cases(fixtures_dir: str | Path, tags: tuple[str, ...]) -> list[str]:
    """Ids of the cases of ``fixtures_dir`` carrying every tag of ``tags`` (forward cases only)."""
    cases = load_manifest(fixtures_dir)["cases"]
    return [c["id"] for c in cases if set(tags) <= set(c.get("tags", [])) and c.get("kind") != "error"]


# module-level factories, so that `gdncheck run gdncheck.conformance.meta.moe_mutants:NAME` works
globals().update({m.name: m.factory for m in MOE_MUTANTS})
