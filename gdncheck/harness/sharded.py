"""Running a sharded case rank by rank (fixtures/FORMAT.md §4.2, §7.1; docs/sharding.md).

A sharded case's program holds one ``shard`` step (after ``construct``) carrying a plan as JSON
(:mod:`gdncheck.sharding`): ``tp``, a tensor-parallel plan every call of the program runs under, or ``cp``
with ``call``, a context-parallel plan of that call's tokens. The whole layer ignores the step (the
goldens are the unsharded layer's); each rank of a port runs its share:

- **tensor parallelism**: the port's optional ``tensor_parallel(cfg, weights, plan, rank, *, profile,
  strict, **options)`` returns an :class:`~.contract.Implementation` of rank ``rank``'s share (``plan``: the
  step's JSON). The program runs on it as on a whole layer; its ``forward`` returns ``(attn_out_partial,
  trace)``, the trace's ``qkv`` and ``qkv_conv`` in the share's channel order ``q | k | v``, the per-head
  tensors of its value heads, its ``state_arrays`` its state shards. :func:`standalone_ranks` makes one
  from a plain layer's factory (a rank as a layer of its heads, :func:`gdncheck.sharding.standalone`).
- **context parallelism**: the port's optional ``context_parallel(cfg, weights, plan, rank, comm, xs,
  conv_state, recurrent_state, *, profile, **options)`` runs rank ``rank``'s segments (``xs``: segment
  index -> its tokens ``[B, n, D]``) entered with the call's state, exchanging with the other ranks
  through ``comm`` (``all_gather_object(parts, obj)`` as ``torch.distributed`` has it), and returns
  ``{"segments.{i}.{halo,M,U,entry_state,out}": array}`` (and ``segments.{i}.attn_out``, the layer's
  ``attn_out`` on the segment's tokens, which tensor × context parallelism reads). A **stage-isolated**
  context-parallel port (one that exposes stages, not the layer: flash-linear-attention's ``fla.ops.cp``)
  names the goldens' stage
  inputs it reads in its method's ``stage_inputs`` attribute (e.g. ``("qkv", "g", "beta")``); it is then
  run in stage-isolated mode only, called with ``stage_inputs={i: {name: [B, n, ...]}}`` (its segments' rows
  of each) as well, and returns ``{"segments.{i}.{stage}": array}`` of the call's stage tensors it computes
  (:func:`isolated_cp_inputs`).
- **tensor × context parallelism** (a ``tpcp`` plan): composed here from the port's ``context_parallel``
  (:func:`tpcp_rank_outputs`): rank r runs its TP share as a layer of its heads
  (:func:`gdncheck.sharding.standalone`) context-parallel over its CP rank's segments, exchanging with its
  CP group (the ranks of its TP rank); its ``out_proj`` partial on a segment is that layer's ``attn_out``
  there, all-reduced over its TP group (the ranks of its CP rank).

:func:`rank_program` is one rank's work on a case, with the collectives of a real run (``dist``:
``torch.distributed`` on spawned ranks, or :class:`ThreadGroup` in one process).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.errors import GDNError
from gdncheck.sharding import SubGroup, plan_from_json, share_order, standalone
from gdncheck.weights import LayerWeights

from .contract import NotApplicable, to_numpy
from .program import CaseInput, call_steps, execute

#: what a tensor-parallel rank writes per call (its share of each; ``attn_out`` after the all-reduce)
TP_RANK_TENSORS = ("qkv", "qkv_conv", "g", "beta", "core", "core_gated", "attn_out_partial", "attn_out",
                   "conv_state", "recurrent_state")
#: what a context-parallel rank writes per segment it owns
CP_RANK_TENSORS = ("halo", "M", "U", "entry_state", "out")
#: what a tensor × context-parallel rank writes per segment it owns (its share of each; ``attn_out`` after the
#: all-reduce over its TP group)
TPCP_RANK_TENSORS = ("halo", "M", "U", "entry_state", "attn_out_partial", "attn_out")
_SHARE_ORDER = ("qkv", "qkv_conv")  # the rank layer's conv channels, read back in the share's order
_PER_HEAD = ("g", "beta", "core", "core_gated")
_SERVING = ("forward_packed", "prefix_snapshots", "verify_spec", "forward_mixed")


class ShardedCaseError(GDNError):
    """A sharded case that cannot be run as its program says (a shard step without a plan, two of them)."""

    code = "sharded_case"


def shard_step(program: Any) -> Mapping[str, Any] | None:
    """The program's ``shard`` step, or None (an unsharded case)."""
    steps = [s for s in program if isinstance(s, Mapping) and s.get("op") == "shard"] if isinstance(program, list) \
        else []
    if len(steps) > 1:
        raise ShardedCaseError(f"expected one shard step in a program, found {len(steps)}")
    return steps[0] if steps else None


def plan_of(step: Mapping[str, Any], cfg: GDNConfig):
    """``(kind, plan, call)`` of a shard step: ``("tp", TPPlan, None)``, ``("cp", CPPlan, call)`` or
    ``("tpcp", TPCPPlan, call)``."""
    kinds = [k for k in ("tp", "cp", "tpcp") if k in step]
    if len(kinds) != 1:
        raise ShardedCaseError("expected a shard step with one plan, tp, cp or tpcp, found "
                               + (" and ".join(kinds) if kinds else "none"))
    kind = kinds[0]
    if kind == "tp":
        return "tp", plan_from_json(step["tp"], cfg), None
    call = step.get("call")
    if isinstance(call, bool) or not isinstance(call, int):
        raise ShardedCaseError(f"expected a context-parallel shard step's call, found {str(call)[:20]!r}")
    plan = plan_from_json(step[kind], cfg)
    if plan.to_json()["kind"] != kind:
        raise ShardedCaseError(f"expected the shard step's {kind} a plan of kind {kind!r}, found "
                               f"{plan.to_json()['kind']!r}")
    return kind, plan, call


def world_of(program: Any, config: Mapping[str, Any]) -> int | None:
    """The world size a sharded case's plan names (None: not sharded)."""
    step = shard_step(program)
    return None if step is None else plan_of(step, GDNConfig.from_hf(dict(config)))[1].world


class RankImplementation:
    """One tensor-parallel rank as an :class:`~.contract.Implementation`: a plain layer of its heads
    (``impl``, built for :func:`gdncheck.sharding.standalone`'s config and weights), its outputs read back
    in the share's layout. ``forward`` returns the rank's ``out_proj`` partial (the layer's ``attn_out``)."""

    def __init__(self, impl: Any, cfg: GDNConfig, share, conv_index: np.ndarray):
        self.impl = impl
        self.name = f"{getattr(impl, 'name', 'implementation')} (rank {share.rank})"
        self._back = share_order(conv_index, len(share.conv_channels(cfg)))

    def _share(self, out: Any, trace: Mapping[str, Any]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        t = {n: to_numpy(trace[n]) for n in (*_SHARE_ORDER, *_PER_HEAD) if n in trace}
        for n in _SHARE_ORDER:
            if n in t:
                t[n] = np.asarray(t[n])[..., self._back]
        if "attn_out" not in trace:
            raise NotApplicable(f"{self.name} keeps no attn_out in its trace: its out_proj partial cannot be read")
        return to_numpy(trace["attn_out"]), t

    def new_state(self, batch: int) -> Any:
        return self.impl.new_state(batch)

    def forward(self, x, state, seq_pos):
        return self._share(*self.impl.forward(x, state, seq_pos))

    def state_arrays(self, state) -> dict[str, Any]:
        arrays = dict(self.impl.state_arrays(state))
        arrays["conv_state"] = np.asarray(to_numpy(arrays["conv_state"]))[:, self._back]
        return arrays

    def snapshot(self, state):
        return self.impl.snapshot(state)

    def restore(self, state, snap) -> None:
        self.impl.restore(state, snap)

    def save_snapshot(self, snap, path: str) -> None:
        self.impl.save_snapshot(snap, path)

    def load_snapshot(self, path: str):
        return self.impl.load_snapshot(path)

    def commit(self, *args) -> None:
        self.impl.commit(*args)

    def free(self, pool, slots) -> None:
        self.impl.free(pool, slots)

    def __getattr__(self, name: str):
        if name not in _SERVING:
            raise AttributeError(name)
        fn = getattr(self.impl, name)

        def packed(*args):
            result = fn(*args)
            out, trace = self._share(result[0], result[1])
            return (out, trace, *result[2:])

        return packed


def standalone_ranks(factory: Callable[..., Any]) -> Callable[..., RankImplementation]:
    """A ``tensor_parallel`` method from a plain layer's factory: each rank a layer of its heads."""

    def tensor_parallel(cfg: GDNConfig, weights, plan, rank: int, *, profile: str, strict: bool = False, **options):
        share = plan_from_json(plan, cfg).shares[rank]
        cfg_r, w_r, conv_index = standalone(cfg, share, weights)
        w_r = LayerWeights({n: np.asarray(a, dtype=np.float32) for n, a in w_r.items()}, config=cfg_r,
                           source=f"rank {rank}'s share")
        impl = factory(cfg_r, w_r, profile=profile, strict=strict, **options)
        return RankImplementation(impl, cfg, share, conv_index)

    return tensor_parallel


def sharded_method(factory: Any, kind: str) -> Callable | None:
    """The factory's ``tensor_parallel`` (kind ``tp``) or ``context_parallel`` (``cp``, and ``tpcp``, which
    composes it with the TP shares: :func:`tpcp_rank_outputs`), or None."""
    return getattr(factory, "tensor_parallel" if kind == "tp" else "context_parallel", None)


class ThreadGroup:
    """The collectives of ``world`` ranks run as threads of one process (``gdncheck run`` without
    ``--world``): ``all_gather_object`` and ``all_reduce`` as ``torch.distributed`` has them."""

    def __init__(self, world: int, timeout_s: float = 300.0):
        self.world = world
        self._barrier = threading.Barrier(world, timeout=timeout_s)
        self._slots: list = [None] * world
        self._rank = threading.local()
        self.failed_rank: int | None = None  # the first rank that gave up (its error is the one to report)

    def abort(self) -> None:
        """This rank gives up: every rank waiting in (or later entering) a collective is released with an error
        instead of waiting for it until the timeout."""
        if self.failed_rank is None:
            self.failed_rank = getattr(self._rank, "value", None)
        self._barrier.abort()

    def bind(self, rank: int) -> ThreadGroup:
        self._rank.value = rank
        return self

    def all_gather_object(self, parts: list, obj: Any) -> None:
        self._barrier.wait()
        self._slots[self._rank.value] = obj
        self._barrier.wait()
        parts[:] = list(self._slots)
        self._barrier.wait()

    def all_reduce(self, tensor: np.ndarray) -> None:
        parts: list = []
        self.all_gather_object(parts, np.array(to_numpy(tensor), dtype=np.float64, copy=True))
        total = parts[0].copy()
        for p in parts[1:]:
            total = total + p
        tensor[...] = total  # in place, as torch.distributed does


def run_in_threads(world: int, fn: Callable[[int, ThreadGroup], Any], timeout_s: float = 300.0) -> list:
    """``fn(rank, group)`` on ``world`` threads; their results by rank, or the first rank's exception."""
    group = ThreadGroup(world, timeout_s)
    results: list = [None] * world
    errors: list = [None] * world

    def body(r: int) -> None:
        try:
            results[r] = fn(r, group.bind(r))
        except BaseException as exc:  # noqa: BLE001 - re-raised below, the first rank's
            errors[r] = exc
            group.abort()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    if any(t.is_alive() for t in threads):
        raise ShardedCaseError(f"expected {world} ranks to finish within {timeout_s:g} s, found ranks still running")
    # the rank that failed first, not the others whose collective it broke
    failed = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
    failed += [e for e in errors if e is not None]
    if failed:
        raise failed[0]
    return results


def tp_rank_outputs(factory: Any, case: CaseInput, plan_json: Mapping, rank: int, *, profile: str,
                    options: Mapping | None = None, snapshot_dir=None):
    """Rank ``rank``'s run of a tensor-parallel case before the all-reduce: ``(tensors, error, na, impl)``,
    tensors ``calls.{k}.{name}`` of :data:`TP_RANK_TENSORS` but ``attn_out`` (:func:`all_reduced` adds it)."""
    method = sharded_method(factory, "tp")
    made: list = []

    def rank_factory(cfg, weights, *, profile, strict=False, **opts):
        made.append(method(cfg, weights, plan_json, rank, profile=profile, strict=strict, **opts))
        return made[-1]

    whole = CaseInput(case.id, case.config, case.weights, case.batch, case.program, case.inputs, None)
    res = execute(rank_factory, whole, profile=profile, options=options, snapshot_dir=snapshot_dir)
    out: dict[str, np.ndarray] = {}
    for step in call_steps(case.program):
        k = step["call"]
        for name in TP_RANK_TENSORS:
            src = "out" if name == "attn_out_partial" else name
            key = f"calls.{k}.{src}"
            if name != "attn_out" and key in res.outputs:
                out[f"calls.{k}.{name}"] = np.asarray(res.outputs[key], dtype=np.float64)
    return out, res.error, res.not_applicable, made[-1] if made else None


def reducer(impl: Any, comm) -> Callable[[np.ndarray], np.ndarray]:
    """The all-reduce of a rank's partial: the rank implementation's own ``reduce(partial, comm)`` where it
    has one (a port that reduces itself), else ``comm.all_reduce``."""
    own = getattr(impl, "reduce", None)

    def reduce(partial: np.ndarray) -> np.ndarray:
        buf = np.array(partial, dtype=np.float64, copy=True)
        if own is not None:
            return np.asarray(to_numpy(own(buf, comm)), dtype=np.float64)
        comm.all_reduce(buf)
        return buf

    return reduce


def all_reduced(tensors: dict[str, np.ndarray], reduce: Callable[[np.ndarray], np.ndarray], program) -> None:
    """Add ``calls.{k}.attn_out``, the all-reduce of each call's partial, in call order (every rank calls
    ``reduce`` the same number of times: a call whose partial is missing reduces zeros of no shape)."""
    for step in call_steps(program):
        key = f"calls.{step['call']}.attn_out_partial"
        if key in tensors:
            tensors[f"calls.{step['call']}.attn_out"] = reduce(tensors[key])


def _entering(cfg: GDNConfig, B: int, state_in: Mapping | None):
    conv = np.zeros((B, cfg.conv_dim, cfg.conv_kernel))
    rec = np.zeros((B, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim))
    if state_in:
        conv = np.asarray(state_in.get("conv_state", conv), dtype=np.float64)
        rec = np.asarray(state_in.get("recurrent_state", rec), dtype=np.float64)
    return conv, rec


def tpcp_rank_outputs(factory: Any, case: CaseInput, plan_json: Mapping, call: int, rank: int, comm, *,
                      profile: str, options: Mapping | None = None, state_in: Mapping | None = None):
    """Rank ``rank`` of a tensor × context-parallel call (a ``tpcp`` plan), composed from the port's
    ``context_parallel``: its TP share as a layer of its heads (:func:`gdncheck.sharding.standalone`) entered with
    its shards of the call's state, run over its CP rank's segments with its CP group, then each segment's
    ``out_proj`` partial (that layer's ``attn_out``) all-reduced over its TP group. Returns
    ``segments.{i}.{halo, M, U, entry_state, attn_out_partial, attn_out}`` in the share's layout (the halo's
    channels ``q | k | v`` of its heads, the rest its value heads); a segment whose partial the port did not
    return is not reduced (verify fails it as missing)."""
    method = sharded_method(factory, "tpcp")
    cfg = GDNConfig.from_hf(dict(case.config))
    plan = plan_from_json(plan_json, cfg)
    share = plan.share(rank)
    cfg_r, w_r, conv_index = standalone(cfg, share, case.weights)
    back = share_order(conv_index, len(share.conv_channels(cfg)))
    x = np.asarray(case.inputs[call])
    xs = {i: x[:, a:b] for i, (r, a, b) in enumerate(plan.cp.segments) if r == plan.cp_rank(rank)}
    conv, rec = _entering(cfg, x.shape[0], state_in)
    conv_r = conv[:, share.conv_channels(cfg)][:, conv_index]
    rec_r = rec[:, share.v_start:share.v_stop]
    weights = LayerWeights({n: np.asarray(a, dtype=np.float32) for n, a in w_r.items()}, config=cfg_r,
                           source=f"fixture {case.id}, rank {rank}'s share")
    got = method(cfg_r, weights, plan.cp.to_json(), plan.cp_rank(rank), SubGroup(comm, plan.world, plan.cp_group(rank)),
                 xs, conv_r, rec_r, profile=profile, **dict(options or {}))
    got = {str(n): np.asarray(to_numpy(t), dtype=np.float64) for n, t in got.items()}
    out: dict[str, np.ndarray] = {}
    for n, t in got.items():
        parts = n.split(".")
        if len(parts) != 3 or parts[0] != "segments":
            continue
        name = {"attn_out": "attn_out_partial"}.get(parts[2], parts[2])
        if name in TPCP_RANK_TENSORS:
            # the halo in the share's channel order; one of another shape is kept as written (verify says its shape)
            fits = name == "halo" and t.ndim == 3 and t.shape[1] == len(conv_index)
            out[f"segments.{parts[1]}.{name}"] = t[:, back] if fits else t
    # the all-reduce over the TP group: one collective on every rank, whatever it holds
    mine = {k: v for k, v in out.items() if k.endswith(".attn_out_partial")}
    parts: list = []
    SubGroup(comm, plan.world, plan.tp_group(rank)).all_gather_object(parts, mine)
    for k in mine:
        if all(k in p and np.shape(p[k]) == np.shape(mine[k]) for p in parts):
            total = np.array(parts[0][k], dtype=np.float64, copy=True)
            for p in parts[1:]:
                total = total + p[k]
            out[k.replace(".attn_out_partial", ".attn_out")] = total
    return out


def isolated_cp_inputs(factory: Any) -> tuple[str, ...]:
    """The goldens' stage inputs a stage-isolated context-parallel port reads (its ``context_parallel``'s
    ``stage_inputs``); () for a port that runs the layer."""
    names = getattr(sharded_method(factory, "cp"), "stage_inputs", ())
    return tuple(str(n) for n in names) if isinstance(names, tuple | list) else ()


def cp_rank_outputs(factory: Any, case: CaseInput, plan_json: Mapping, call: int, rank: int, comm, *,
                    profile: str, options: Mapping | None = None, state_in: Mapping | None = None):
    """Rank ``rank``'s segments of the context-parallel call ``call``, entered with ``state_in`` (the goldens'
    entering state, ``conv_state`` / ``recurrent_state``; zeros when none; and, for a stage-isolated port,
    ``stage_inputs``: name -> the call's whole golden tensor, of which each segment gets its rows)."""
    method = sharded_method(factory, "cp")
    cfg = GDNConfig.from_hf(dict(case.config))
    plan = plan_from_json(plan_json, cfg)
    x = np.asarray(case.inputs[call])
    xs = {i: x[:, a:b] for i, (r, a, b) in enumerate(plan.segments) if r == rank}
    conv, rec = _entering(cfg, x.shape[0], state_in)
    weights = LayerWeights(case.weights, config=cfg, source=f"fixture {case.id}")
    extra = {}
    if isolated_cp_inputs(factory):
        whole = dict((state_in or {}).get("stage_inputs") or {})
        extra["stage_inputs"] = {i: {n: np.asarray(t)[:, a:b] for n, t in whole.items()}
                                 for i, (r, a, b) in enumerate(plan.segments) if r == rank}
    got = method(cfg, weights, dict(plan_json), rank, comm, xs, conv, rec, profile=profile, **extra,
                 **dict(options or {}))
    return {str(n): np.asarray(to_numpy(t), dtype=np.float64) for n, t in got.items()}
