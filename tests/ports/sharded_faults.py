"""Ports that commit the field's sharding bugs (docs/sharding.md; conformance/ports/distributed.py's
TP_FAULTS and CP_FAULTS; a padded rank's, PADDING_FAULTS) as ``tensor_parallel`` / ``context_parallel``
methods of the port contract, for
``gdncheck run tests.ports.sharded_faults:NAME``: each must fail verify at its rank and stage. The kill
matrix's sharding mutants run the same ports (gdncheck/conformance/ports/sharded_faults.py); a port
padded as vLLM PR 47759 pads, correctly (``padded_inert``); a port without the sharded methods;
stage-isolated context-parallel ports (as fla's ``fla.ops.cp`` is), fed the goldens' stage inputs, right and
wrong."""

from __future__ import annotations

import numpy as np

from gdncheck.conformance.ports.distributed import CP_FAULTS, TP_FAULTS
from gdncheck.conformance.ports.implementations import reference
from gdncheck.conformance.ports.sharded_faults import PADDING_FAULTS, padded_port, sharded_port
from gdncheck.harness import NotApplicable
from gdncheck.reference.conv1d import conv1d

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



def short_halo(cfg, weights, **kw):
    """A port whose context-parallel halo lacks its last conv channel (a rank's channels miscounted)."""
    return reference(cfg, weights, **kw)


def _short_halo(cfg, weights, plan, rank, comm, xs, conv_state, recurrent_state, **options):
    got = reference.context_parallel(cfg, weights, plan, rank, comm, xs, conv_state, recurrent_state, **options)
    return {n: t[:, :-1] if n.endswith(".halo") else t for n, t in got.items()}


short_halo.context_parallel = _short_halo
def _isolated(mode: str):
    """A stage-isolated context-parallel port: every rank gathers the segments' golden pre-conv ``qkv``, runs the
    float64 conv over the whole call from its entering conv state and writes its segments' ``qkv_conv``; ``mode``
    ``drops_one`` (rank 1 leaves its first segment out) or ``nothing`` (no rank writes a tensor)."""

    def factory(cfg, weights, **kw):
        raise NotApplicable("a context-parallel port only")

    def context_parallel(cfg, weights, plan, rank, comm, xs, conv_state, recurrent_state, *, stage_inputs,
                         **options):
        parts: list = [None] * int(plan["world"])
        comm.all_gather_object(parts, {i: s["qkv"] for i, s in stage_inputs.items()})
        qkv = {i: t for p in parts for i, t in p.items()}
        whole = np.concatenate([qkv[i] for i in sorted(qkv, key=lambda i: plan["segments"][i]["tokens"][0])], axis=1)
        conv, _ = conv1d(whole, conv_state, np.asarray(weights["linear_attn.conv1d.weight"]))
        out = {f"segments.{i}.qkv_conv": conv[:, s["tokens"][0]:s["tokens"][1]]
               for i, s in enumerate(plan["segments"]) if s["rank"] == rank}
        if mode == "drops_one" and rank == 1:
            out.pop(min(out))
        return {} if mode == "nothing" else out

    context_parallel.stage_inputs = ("qkv",)
    factory.context_parallel = context_parallel
    return factory


isolated_conv, isolated_conv_drops_one, isolated_nothing = (_isolated(m) for m in ("right", "drops_one", "nothing"))
