"""flash-linear-attention's context parallelism as a port (conformance/engines/fla_cp/README.md): a CP-only,
stage-isolated port of the contract's sharded method (``context_parallel``, gdncheck.harness.sharded).

``gdncheck run gdncheck.conformance.engines.fla_cp.adapter:fla_cp --stage-isolated`` (what ``gdncheck
engines --engine fla-cp`` runs): every case but a context-parallel one fla's layouts can run is not
applicable, with the reason. On a context-parallel case each rank is given its segments' rows of the
goldens' pre-conv ``qkv``, ``g`` and ``beta`` (``stage_inputs``) and returns fla's ``qkv_conv`` and
``core`` of each segment; verify judges them rank by rank, segment by segment (docs/sharding.md).

The ranks are real ``torch.distributed`` ranks whatever runs them: under ``gdncheck run --world N`` this
rank's own group (``comm.dist``); in one process (``gdncheck run`` without ``--world``, as the matrix
runs it, the ranks as threads) the threads hand their inputs to rank 0, which launches fla's ranks on
``world`` spawned gloo processes (:func:`gdncheck.conformance.ports.distributed.launch`) and gives each
thread its rank's tensors.
"""

from __future__ import annotations

import tempfile
import threading
import weakref

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.harness import NotApplicable
from gdncheck.sharding import cp_plan, plan_from_json

#: the goldens' stage inputs a rank reads (pre-conv qkv, the log decay, beta)
STAGE_INPUTS = ("qkv", "g", "beta")
#: the most one launch of fla's ranks may take (interpreted: 40-60 s here for 24 tokens); below the 300 s an
#: in-process rank waits for another (gdncheck.harness.sharded.run_in_threads)
LAUNCH_TIMEOUT_S = 280.0
CP_ONLY = ("flash-linear-attention's context parallelism (fla.ops.cp) is a CP-only port: it runs the split "
           "call of a context-parallel case, not a whole layer (the fla engine judges its single-device kernels)")


def fla_cp(cfg: GDNConfig, weights, *, profile: str, strict: bool = False, **options):
    """The layer factory: never a layer (a CP-only port); its ``context_parallel`` runs the CP cases."""
    raise NotApplicable(CP_ONLY)


def applicable(cfg: GDNConfig, plan, batch: int, conv_state, recurrent_state, stage_inputs, profile: str) -> None:
    """Raise :class:`NotApplicable` for a call fla's context parallelism cannot run as the case asks (the same
    answer on every rank: before any collective)."""
    if _cuda():
        raise NotApplicable("this glue runs fla's context parallelism on CPU tensors under Triton's interpreter "
                            "(gloo); with CUDA, fla's ranks need a GPU each and NCCL, which it does not set up")
    if profile != "f32":
        raise NotApplicable(f"fla's context parallelism runs here in float32 (the profile f32), not {profile}")
    if batch != 1:
        raise NotApplicable(f"fla's context parallelism splits one sequence (cu_seqlens [0, T]); this call has a "
                            f"batch of {batch}")
    if np.any(np.asarray(conv_state)) or np.any(np.asarray(recurrent_state)):
        raise NotApplicable("fla's context parallelism takes no entering state (chunk_gated_delta_rule's "
                            "initial_state with a cp_context; its calls start from zeros), and this call enters "
                            "with a nonzero one")
    parts = plan.world * (2 if plan.layout == "zigzag" else 1)
    fla_split = cp_plan(plan.T, plan.world, plan.layout).segments if plan.T % parts == 0 else None
    if fla_split != plan.segments:
        raise NotApplicable(f"fla's {plan.layout} layout splits the call's {plan.T} tokens into {parts} equal parts "
                            f"(T divisible by {parts}); this plan's segments are "
                            f"{[[a, b] for _, a, b in plan.segments]}")
    missing = [n for n in STAGE_INPUTS if any(n not in s for s in stage_inputs.values())]
    if missing:
        raise NotApplicable(f"the case keeps no golden {', '.join(missing)} of the split call (stage inputs)")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def context_parallel(cfg: GDNConfig, weights, plan, rank: int, comm, xs, conv_state, recurrent_state, *,
                     profile: str, stage_inputs=None, **options) -> dict[str, np.ndarray]:
    """Rank ``rank``'s segments through fla's ``causal_conv1d_cp`` and ``chunk_gated_delta_rule(...,
    cp_context=...)``: ``{"segments.{i}.qkv_conv", "segments.{i}.core"}``."""
    from .cp import fla_cp_rank

    cp = plan_from_json(plan, cfg)
    stage_inputs = dict(stage_inputs or {})
    batch = np.asarray(next(iter(xs.values()))).shape[0] if xs else 1
    applicable(cfg, cp, batch, conv_state, recurrent_state, stage_inputs, profile)
    w = np.asarray(weights["linear_attn.conv1d.weight"], dtype=np.float64)
    mine = {n: {i: np.asarray(s[n]) for i, s in stage_inputs.items()} for n in STAGE_INPUTS}
    spec = {"cfg": cfg.to_hf(), "plan": cp.to_json(), **mine, "conv_weight": w.reshape(w.shape[0], w.shape[-1]),
            "glue": "none"}
    dist = getattr(comm, "dist", None)
    if dist is not None:  # a spawned rank of `gdncheck run --world N`: fla runs on this rank's own group
        return fla_cp_rank(rank, cp.world, dist, spec)
    parts: list = [None] * cp.world  # ranks as threads: rank 0 launches fla's ranks for all of them
    comm.all_gather_object(parts, mine)
    for p in parts:
        for n in STAGE_INPUTS:
            spec[n].update(p[n])
    return _shared_launch(comm, rank, cp.world, spec)


context_parallel.stage_inputs = STAGE_INPUTS  # a stage-isolated context-parallel port (gdncheck.harness.sharded)
fla_cp.context_parallel = context_parallel
fla_cp.options = ()  # it takes no --option

#: the launch of each in-process group, keyed by the group itself (weakly: a group that is gone takes its entry
#: with it, and a later group never meets an earlier one's result or error, as an id could)
_LAUNCHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _shared_launch(comm, rank: int, world: int, spec: dict) -> dict[str, np.ndarray]:
    """One launch of fla's ranks per in-process group: the first thread to arrive runs it, the others wait for
    it (a lock, not a collective: the launch outlasts no collective's timeout); each takes its rank's tensors."""
    from gdncheck.conformance.ports.distributed import launch

    from .cp import fla_cp_rank

    with _LOCK:
        slot = _LAUNCHES.setdefault(comm, {"lock": threading.Lock(), "left": world})
    with slot["lock"]:
        if "result" not in slot and "error" not in slot:
            try:
                with tempfile.TemporaryDirectory(prefix="gdncheck-fla-cp-") as folder:
                    slot["result"] = launch(fla_cp_rank, world, spec, folder, timeout_s=LAUNCH_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - every rank raises it
                slot["error"] = exc
    with _LOCK:
        slot["left"] -= 1
        if slot["left"] == 0:
            _LAUNCHES.pop(comm, None)
    if "error" in slot:
        raise slot["error"]
    return slot["result"][rank]
