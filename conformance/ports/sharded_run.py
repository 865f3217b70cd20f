"""``gdncheck run`` on the sharded cases (fixtures/FORMAT.md §4.2, §7.1; docs/sharding.md).

Every rank of a sharded case runs its share with the port's own code (``tensor_parallel`` /
``context_parallel``, :mod:`gdncheck.harness.sharded`) and the collectives of a real run, and writes
``{case}.rank{r}.safetensors``; the case's outputs file ``{case}.safetensors`` carries the run's metadata
(``sharded``, ``world``) and no tensor. Two ways to run the ranks:

- without ``--world`` (the gate, a plain ``run``): in this process, rank by rank, the all-reduce and the
  context-parallel exchange (both, for tensor × context parallelism) on threads
  (:class:`~gdncheck.harness.sharded.ThreadGroup`);
- ``--world N``: N spawned processes on ``torch.distributed`` (gloo on CPUs, NCCL where CUDA is), one
  launch for every sharded case selected (:func:`gdncheck.conformance.ports.distributed.launch`).
"""

from __future__ import annotations

import json
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.errors import GDNError
from gdncheck.features import not_applicable_reason
from gdncheck.harness.contract import NotApplicable, error_code
from gdncheck.harness.sharded import (
    all_reduced,
    cp_rank_outputs,
    isolated_cp_inputs,
    plan_of,
    reducer,
    run_in_threads,
    shard_step,
    sharded_method,
    tp_rank_outputs,
    tpcp_rank_outputs,
)
from gdncheck.safetensors_io import SafetensorsFile

from .distributed import DistributedRunError, launch


class WorldError(GDNError):
    """``--world`` that is no world size, or that does not match a sharded case's plan."""

    code = "usage"


#: the most ranks ``--world`` may start on one machine
MAX_WORLD = 64


def parse_world(value) -> int | None:
    """``--world``: None, or a whole number in [1, MAX_WORLD]; anything else refused in one line."""
    if value is None:
        return None
    text = str(value).strip()
    if not text.isdecimal() or len(text) > 6 or not 1 <= int(text) <= MAX_WORLD:
        raise WorldError(f"expected --world a whole number of ranks in [1, {MAX_WORLD}], found {str(value)[:40]!r}")
    return int(text)


def is_sharded(entry: Mapping) -> bool:
    return entry.get("kind") == "forward" and shard_step(entry.get("program")) is not None


def case_plan(entry: Mapping):
    """``(kind, plan, call)`` of a sharded manifest entry."""
    return plan_of(shard_step(entry["program"]), GDNConfig.from_hf(dict(entry["config"])))


def check_world(entries: list[dict], world: int | None) -> None:
    """Refuse (before anything runs) a ``--world`` that a selected sharded case's plan does not name."""
    if world is None:
        return
    for e in entries:
        if is_sharded(e):
            plan_world = case_plan(e)[1].world
            if plan_world != world:
                raise WorldError(f"expected --world to match the plan of every sharded case selected, found "
                                 f"--world {world} but case {e['id']} is planned for {plan_world} ranks (select the "
                                 f"cases of one world: --tag world-{world})")


def _status(error=None, na=None) -> dict:
    return {"error": error, "not_applicable": na}


#: the error of a rank released from a collective because another rank failed (that one's error is reported)
RELEASED = "released from a collective: another rank failed"


def rank_work(factory, entry: Mapping, inp, gold_state_in: Mapping, profile: str, options, rank: int, comm,
              snapshot_dir):
    """One rank's share of one case before the collectives of TP: ``(tensors, status, impl)``; CP and TP × CP
    run whole here, their collectives included (impl None)."""
    kind, plan, call = case_plan(entry)
    step = shard_step(entry["program"])
    if kind == "tp":
        tensors, error, na, impl = tp_rank_outputs(factory, inp, step["tp"], rank, profile=profile, options=options,
                                                   snapshot_dir=snapshot_dir)
        return tensors, _status(error, na), impl
    run_call = cp_rank_outputs if kind == "cp" else tpcp_rank_outputs
    try:
        tensors = run_call(factory, inp, step[kind], call, rank, comm, profile=profile, options=options,
                           state_in=gold_state_in)
    except threading.BrokenBarrierError as exc:  # another rank failed and released this one from a collective
        return {}, _status({"code": error_code(exc), "message": RELEASED, "step": entry["program"].index(step)}), None
    except NotApplicable as exc:  # a case the port cannot express (every rank says so before any collective)
        return {}, _status(na={"reason": str(exc) or "not applicable", "step": entry["program"].index(step)}), None
    except Exception as exc:  # noqa: BLE001 - the port's failure is a result
        abort = getattr(comm, "abort", None)
        if abort is not None:  # the other ranks wait in a collective for this one: release them
            abort()
        return {}, _status({"code": error_code(exc), "message": str(exc) or type(exc).__name__,
                            "step": entry["program"].index(step)}), None
    return tensors, _status(), None


def state_in(gold: SafetensorsFile, entry: Mapping, factory=None) -> dict:
    """A context-parallel case's entering state from the goldens; for a stage-isolated port
    (:func:`~gdncheck.harness.sharded.isolated_cp_inputs`), also ``stage_inputs``: the call's golden stage
    inputs it reads, whole (each rank gets its segments' rows)."""
    kind, _, call = case_plan(entry)
    if kind not in ("cp", "tpcp"):
        return {}
    out = {n: gold.read(f"calls.{call}.{n}_in") for n in ("conv_state", "recurrent_state")
           if f"calls.{call}.{n}_in" in gold}
    names = isolated_cp_inputs(factory) if factory is not None else ()
    if names:
        out["stage_inputs"] = {n: gold.read(f"calls.{call}.{n}") for n in names if f"calls.{call}.{n}" in gold}
    return out


def not_applicable(factory, entry: Mapping, stage_isolated: bool = False) -> dict | None:
    """The case's not-applicable verdict for a port without the sharded method it needs (or without the
    feature, where it declares its features), at the shard step; a stage-isolated context-parallel port
    (:func:`~gdncheck.harness.sharded.isolated_cp_inputs`) runs in stage-isolated mode only."""
    kind = case_plan(entry)[0]
    step = entry["program"].index(shard_step(entry["program"]))
    declared = getattr(factory, "features", None)
    if (declared is not None and "sharded" not in declared) or sharded_method(factory, kind) is None:
        reason = not_applicable_reason(["sharded"])
        if sharded_method(factory, "cp" if kind == "tp" else "tp") is not None:  # a port of one kind of sharding
            reason += (": a context-parallel port, this case is tensor-parallel" if kind == "tp" else
                       ": a tensor-parallel port, this case is context-parallel")
        return {"reason": reason, "step": step}
    if kind == "cp" and bool(isolated_cp_inputs(factory)) != stage_isolated:
        return {"reason": "its context parallelism is stage-isolated (it is fed the goldens' stage inputs): run it "
                          "with --stage-isolated" if not stage_isolated else
                          "its context parallelism runs the whole layer: judged end to end, not stage-isolated",
                "step": step}
    return None


def run_in_process(factory, entry: Mapping, inp, gold: SafetensorsFile, profile: str, options, snapshot_dir):
    """Every rank of one case in this process: ``(ranks' tensors, status)``."""
    kind, plan, _ = case_plan(entry)
    entering = state_in(gold, entry, factory)
    if kind in ("cp", "tpcp"):
        results = run_in_threads(plan.world, lambda r, g: rank_work(factory, entry, inp, entering, profile, options,
                                                                    r, g, snapshot_dir))
        bad = [s for _, s, _ in results if s["error"] or s["not_applicable"]]
        # the rank that failed first, not those its abort released from a collective
        bad.sort(key=lambda s: (s["error"] or {}).get("message") == RELEASED)
        return [t for t, _, _ in results], bad[0] if bad else _status()
    ranks, impls = [], []
    for r in range(plan.world):
        tensors, status, impl = rank_work(factory, entry, inp, entering, profile, options, r, None, snapshot_dir)
        ranks.append(tensors)
        impls.append(impl)
        if status["error"] or status["not_applicable"]:
            return ranks, status
    run_in_threads(plan.world, lambda r, g: all_reduced(ranks[r], reducer(impls[r], g), entry["program"]))
    return ranks, _status()


# --- spawned ranks (--world N) -------------------------------------------------------------------


class TorchGroup:
    """``torch.distributed`` seen as the collectives of :mod:`gdncheck.harness.sharded` (NumPy in place)."""

    def __init__(self, dist):
        self.dist = dist

    def all_gather_object(self, parts: list, obj) -> None:
        self.dist.all_gather_object(parts, obj)

    def all_reduce(self, buf: np.ndarray) -> None:
        import torch

        t = torch.from_numpy(np.array(buf, dtype=np.float64, copy=True))
        if self.dist.get_backend() == "nccl":
            t = t.cuda()
        self.dist.all_reduce(t)
        buf[...] = t.cpu().numpy()


def spawned_rank(rank: int, world: int, dist, spec: dict) -> dict[str, np.ndarray]:
    """The rank program of ``--world N``: every selected sharded case's share, in order (a module-level
    function: spawned ranks import it). Each case's tensors are prefixed ``c{j}.``; its status is JSON in
    ``c{j}.__status__``."""
    from gdncheck.conformance.ports.plugin import load_factory

    factory = load_factory(spec["impl"]) if isinstance(spec["impl"], str) else spec["impl"]
    if dist.get_backend() == "nccl":  # one GPU a rank (NCCL is chosen only where there are enough)
        import torch

        torch.cuda.set_device(rank)
    comm = TorchGroup(dist)
    out: dict[str, np.ndarray] = {}
    for j, entry in enumerate(spec["cases"]):
        inp, entering = spec["inputs"][entry["id"]]
        with tempfile.TemporaryDirectory(prefix="gdncheck-rank-snapshots-") as snaps:
            tensors, status, impl = rank_work(factory, entry, inp, entering, spec["profile"], spec["options"], rank,
                                              comm, snaps)
        if case_plan(entry)[0] == "tp":  # the same reduces on every rank: the calls every rank has
            parts: list = [None] * world
            comm.all_gather_object(parts, (status, sorted(tensors)))
            if all(not (s["error"] or s["not_applicable"]) for s, _ in parts):
                common = set.intersection(*(set(keys) for _, keys in parts))
                _reduce_common(tensors, common, reducer(impl, comm), entry["program"])
        out.update({f"c{j}.{k}": v for k, v in tensors.items()})
        out[f"c{j}.__status__"] = np.frombuffer(json.dumps(status).encode(), dtype=np.uint8).copy()
    return out


def _reduce_common(tensors: dict, common: set, red, program) -> None:
    shared = {k: v for k, v in tensors.items() if k in common}
    all_reduced(shared, red, program)
    tensors.update({k: v for k, v in shared.items() if k.endswith(".attn_out")})


def run_spawned(impl, inputs: Mapping[str, tuple], entries: list[dict], world: int, profile: str, options, work: Path,
                timeout_s: float = 600.0):
    """Every sharded case of ``entries`` on ``world`` spawned ranks (one launch): per case, its ranks'
    tensors and its status. ``inputs``: case id -> (its :class:`~gdncheck.harness.CaseInput`, its entering
    state, :func:`state_in`)."""
    import torch

    backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo"
    spec = {"impl": impl, "inputs": dict(inputs), "cases": entries, "profile": profile,
            "options": dict(options or {})}
    try:
        ranks = launch(spawned_rank, world, spec, work, backend=backend, timeout_s=timeout_s)
    except DistributedRunError as exc:
        status = _status({"code": exc.code, "message": str(exc), "step": 0})
        return {e["id"]: ([{} for _ in range(world)], status) for e in entries}
    out = {}
    for j, entry in enumerate(entries):
        per_rank = [{k[len(f"c{j}."):]: v for k, v in r.items() if k.startswith(f"c{j}.")} for r in ranks]
        statuses = [json.loads(bytes(np.asarray(r.pop("__status__", np.zeros(0, np.uint8)), dtype=np.uint8))
                               .decode() or "{}") for r in per_rank]
        bad = [s for s in statuses if s.get("error") or s.get("not_applicable")]
        out[entry["id"]] = (per_rank, bad[0] if bad else _status())
    return out
