"""A sharded layer run on a real distributed runtime: N ranks on ``torch.distributed`` (docs/sharding.md).

:func:`launch` starts ``world`` processes (spawned, gloo on CPUs; NCCL needs one GPU a rank), each inside
an initialised process group whose rendezvous is a file in the run's folder (no network port), runs a
rank program in each and collects what each rank wrote to ``rank{r}.safetensors`` in that folder. Every
start has a deadline: on a timeout, or as soon as one rank fails, every rank is killed and
:class:`DistributedRunError` names the rank and its one-line error; nothing outlives the call.

Two rank programs, each the implementation's own code on its share, with the collectives a serving or
training engine makes:

- :func:`tp_rank`: tensor parallelism. Each rank runs its heads (the float64 reference's
  ``rank_forward`` or the Triton path's ``RankLayer``) and all-reduces its ``out_proj`` partial.
- :func:`cp_rank`: context parallelism. Each rank holds only its tokens; ranks all-gather the pre-conv
  tails of their segments (the conv halos) and the affine summaries of their segments, and each enters
  its segments with the call's state composed through its predecessors' summaries, in token order.

A ``fault`` (tests and the kill matrix only) makes a rank program commit one of the field's sharding
bugs, so that the judge can be shown to catch it.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.errors import GDNError
from gdncheck.safetensors_io import read_safetensors, write_safetensors
from gdncheck.sharding import cp_plan, gathered, plan_from_json, rank_weights, state_shards, tp_plan

#: the faults a rank program can be asked to commit (the field's sharding bugs, docs/sharding.md)
TP_FAULTS = ("none", "partial_not_reduced", "partial_reduced_twice", "ranks_swapped", "a_sliced_by_key_heads",
             "conv_weight_one_block")
CP_FAULTS = ("none", "no_halo", "entry_from_zeros", "summaries_reversed", "decay_on_both")
DEFAULT_TIMEOUT_S = 300.0


class DistributedRunError(GDNError):
    """A distributed run that did not finish: a rank raised, died or ran past its deadline."""

    code = "distributed_run"


def _init(rank: int, world: int, store: str, backend: str):
    import torch.distributed as dist

    # an absolute path: in file://ref/x the first name is a host, and a relative --out never met its ranks
    dist.init_process_group(backend, init_method=Path(store).resolve().as_uri(), rank=rank, world_size=world)
    return dist


def _rank_main(rank: int, world: int, folder: str, backend: str, program: str, spec: dict) -> None:
    """The body of every spawned rank: join the group, run the program, write its file, or its error."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    out = Path(folder)
    try:
        dist = _init(rank, world, str(out / "store"), backend)
        try:
            tensors = (PROGRAMS[program] if isinstance(program, str) else program)(rank, world, dist, spec)
            write_safetensors(out / f"rank{rank}.safetensors", tensors, {"rank": str(rank), "world": str(world)})
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, one line
        line = f"{type(exc).__name__}: {exc}".splitlines()[0][:400]
        (out / f"rank{rank}.error").write_text(line + "\n" + traceback.format_exc(limit=8))
        raise SystemExit(1) from None


def launch(program: str, world: int, spec: dict, folder, *, backend: str = "gloo",
           timeout_s: float = DEFAULT_TIMEOUT_S) -> list[dict[str, np.ndarray]]:
    """Run rank program ``program`` on ``world`` spawned ranks; return what each rank wrote, by rank.

    ``program``: a name of :data:`PROGRAMS`, or a module-level function ``f(rank, world, dist, spec)`` returning
    the rank's tensors (an engine's adapter: ``conformance/engines/fla_cp/cp.py``).
    ``folder``: where the ranks write (``rank{r}.safetensors``, ``rank{r}.error``) and rendezvous; it must
    exist and be empty of rank files. Raises :class:`DistributedRunError` on a rank's failure or the deadline.
    """
    import torch.multiprocessing as mp

    if not callable(program) and program not in PROGRAMS:
        raise DistributedRunError(f"expected a rank program among {', '.join(PROGRAMS)}, found {program!r}")
    folder = Path(folder)
    ctx = mp.start_processes(_rank_main, args=(world, str(folder), backend, program, spec), nprocs=world,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                if ctx.join(timeout=1.0):
                    break
            except mp.ProcessExitedException as exc:
                raise DistributedRunError(_failure(folder, exc.error_index, exc.exit_code)) from None
            except mp.ProcessRaisedException as exc:  # pragma: no cover - ranks exit, they do not raise
                raise DistributedRunError(str(exc).splitlines()[0]) from None
            if time.monotonic() > deadline:
                raise DistributedRunError(f"expected {world} ranks to finish within {timeout_s:g} s, found "
                                          f"ranks still running ({program}); every rank was stopped")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
            p.join(5)
    return [read_safetensors(folder / f"rank{r}.safetensors")[0] for r in range(world)]


def _failure(folder: Path, rank: int, code) -> str:
    err = folder / f"rank{rank}.error"
    said = err.read_text().splitlines()[0] if err.exists() else f"exit status {code}"
    return f"rank {rank} failed: {said}; the other ranks were stopped"


def run_tp(cfg: GDNConfig, weights, plan, calls, *, impl: str = "reference", profile: str = "f32",
           fault: str = "none", timeout_s: float = DEFAULT_TIMEOUT_S, folder=None):
    """Tensor-parallel run of ``calls`` (``[(x [B, T, D], seq_pos), ...]`` from a zero state) on
    ``plan.world`` ranks: per rank, per call ``k``, ``calls.{k}.attn_out_partial``, ``calls.{k}.attn_out``
    (after the all-reduce), its share's stage tensors, and its state shards."""
    _check_fault(fault, TP_FAULTS)
    spec = {"cfg": cfg.to_hf(), "weights": {n: np.asarray(w) for n, w in weights.items()},
            "plan": plan.to_json(), "calls": [(np.asarray(x), int(p)) for x, p in calls], "impl": impl,
            "profile": profile, "fault": fault}
    return _run("tp", plan.world, spec, timeout_s, folder)


def run_cp(cfg: GDNConfig, weights, plan, x, conv_state, recurrent_state, *, fault: str = "none",
           timeout_s: float = DEFAULT_TIMEOUT_S, folder=None):
    """Context-parallel run of one call ``x`` [B, T, D] entered with the given states, on ``plan.world``
    ranks: per rank, per segment ``i`` it owns, ``segments.{i}.{halo,M,U,entry_state,out}`` (float64)."""
    _check_fault(fault, CP_FAULTS)
    spec = {"cfg": cfg.to_hf(), "weights": {n: np.asarray(w) for n, w in weights.items()}, "plan": plan.to_json(),
            "conv_state": np.asarray(conv_state), "recurrent_state": np.asarray(recurrent_state), "fault": fault,
            "x": {i: np.asarray(x)[:, a:b] for i, (r, a, b) in enumerate(plan.segments)}}
    return _run("cp", plan.world, spec, timeout_s, folder)


def _check_fault(fault, known) -> None:
    if fault not in known:
        raise DistributedRunError(f"expected a fault among {', '.join(known)}, found {fault!r}")


def _run(program, world, spec, timeout_s, folder):
    if folder is not None:
        return launch(program, world, spec, folder, timeout_s=timeout_s)
    with tempfile.TemporaryDirectory(prefix="gdncheck-ranks-") as tmp:
        return launch(program, world, spec, tmp, timeout_s=timeout_s)


# --- rank programs ---------------------------------------------------------------------------------


def tp_rank(rank: int, world: int, dist, spec: dict) -> dict[str, np.ndarray]:
    import torch

    cfg = GDNConfig.from_hf(spec["cfg"])
    plan = plan_from_json(spec["plan"], cfg)
    fault = spec["fault"]
    share = plan.shares[(world - 1 - rank) if fault == "ranks_swapped" else rank]
    zeros_conv = np.zeros((spec["calls"][0][0].shape[0], cfg.conv_dim, cfg.conv_kernel))
    zeros_rec = np.zeros((zeros_conv.shape[0], cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim))
    conv_r, rec_r = state_shards(cfg, share, zeros_conv, zeros_rec)
    if spec["impl"] == "triton":
        from gdncheck.gpu_impl.sharded import RankLayer

        layer = RankLayer(cfg, spec["weights"], share, profile=spec["profile"])
        state = layer.new_state(conv_r, rec_r, np.zeros(conv_r.shape[0], dtype=np.int64))
    else:
        from gdncheck.reference.sharded import rank_forward

        w_r = rank_weights(cfg, spec["weights"], share)
        if fault == "a_sliced_by_key_heads":  # ROLL PR 497: one gate tensor not sliced like the heads
            n = share.v_stop - share.v_start
            w_r["linear_attn.in_proj_a.weight"] = np.asarray(spec["weights"]["linear_attn.in_proj_a.weight"])[
                share.k_start:share.k_start + n]
        if fault == "conv_weight_one_block":  # the conv weight split as one block, not per q/k/v segment
            n = len(share.conv_channels(cfg))
            conv = np.asarray(spec["weights"]["linear_attn.conv1d.weight"], dtype=np.float64)
            w_r["linear_attn.conv1d.weight"] = conv[share.rank * n:(share.rank + 1) * n]
    out: dict[str, np.ndarray] = {}
    for k, (x, pos) in enumerate(spec["calls"]):
        if spec["impl"] == "triton":
            partial, trace = layer.forward(x, state, pos)
            partial = partial.detach().to("cpu", torch.float64).numpy()
            conv_r, rec_r = layer.shards(state)
            trace = {n: trace[n] for n in ("qkv", "qkv_conv", "g", "beta", "core", "core_gated")}
        else:
            partial, conv_r, rec_r, trace = rank_forward(cfg, share, w_r, x, conv_r, rec_r)
        reduced = torch.from_numpy(np.array(partial, dtype=np.float64, copy=True))  # all_reduce works in place
        if fault != "partial_not_reduced":
            dist.all_reduce(reduced)
        if fault == "partial_reduced_twice":
            dist.all_reduce(reduced)
        out[f"calls.{k}.attn_out_partial"] = np.asarray(partial, dtype=np.float64)
        out[f"calls.{k}.attn_out"] = reduced.numpy()
        out[f"calls.{k}.conv_state"], out[f"calls.{k}.recurrent_state"] = conv_r, rec_r
        for name, t in trace.items():
            if name != "attn_out_partial":
                out[f"calls.{k}.{name}"] = _host(t)
    return out


def cp_rank(rank: int, world: int, dist, spec: dict) -> dict[str, np.ndarray]:
    from gdncheck.reference import input_norm
    from gdncheck.reference.in_proj import in_proj
    from gdncheck.reference.layer import Params, layer_forward
    from gdncheck.reference.sharded import apply, conv_halo, expand_to_values, summary

    cfg = GDNConfig.from_hf(spec["cfg"])
    plan = plan_from_json(spec["plan"], cfg)
    fault = spec["fault"]
    params = Params({n: np.asarray(w, dtype=np.float64) for n, w in spec["weights"].items()})
    K = cfg.conv_kernel
    mine = [i for i, (r, _, _) in enumerate(plan.segments) if r == rank]
    xs = {i: np.asarray(spec["x"][i], dtype=np.float64) for i in mine}
    # 1. the pre-conv tails of my segments (their last K rows), gathered by every rank: the conv halos
    tails = {}
    for i in mine:
        qkv = in_proj(input_norm(xs[i], params["input_layernorm.weight"], cfg.rms_norm_eps),
                      params["linear_attn.in_proj_qkv.weight"], params["linear_attn.in_proj_z.weight"],
                      params["linear_attn.in_proj_a.weight"], params["linear_attn.in_proj_b.weight"])[0]
        tails[i] = qkv[:, -K:]
    tails = gathered(dist, world, tails)
    conv0, rec0 = np.asarray(spec["conv_state"], dtype=np.float64), np.asarray(spec["recurrent_state"], np.float64)
    halos = {}
    for i in mine:
        before = [tails[j] for j in range(i)]
        rows = np.concatenate(before, axis=1) if before else np.zeros((conv0.shape[0], 0, conv0.shape[1]))
        halos[i] = np.zeros_like(conv0) if fault == "no_halo" and i else conv_halo(rows, conv0, rows.shape[1])
    # 2. the summaries of my segments (from the zero state, with their halos), gathered by every rank
    kv = np.arange(cfg.num_v_heads) // cfg.head_ratio
    summaries = {}
    for i in mine:
        _, _, _, trace = layer_forward(cfg, params, xs[i], halos[i], np.zeros_like(rec0), delta_rule="recurrent")
        summaries[i] = summary(expand_to_values(trace["k"], kv), trace["v"], trace["g"], trace["beta"])
        if fault == "decay_on_both":  # the segment's decay applied to the bias too (shainet PR 170's class)
            M, U = summaries[i]
            summaries[i] = (M, U * np.exp(trace["g"].sum(axis=1))[..., None, None])
    summaries = gathered(dist, world, summaries)
    # 3. my entry states: the call's state through my predecessors' summaries, in token order
    out: dict[str, np.ndarray] = {}
    for i in mine:
        order = list(range(i))[::-1] if fault == "summaries_reversed" else list(range(i))
        entry = rec0
        for j in order:
            entry = apply(summaries[j], entry)
        if fault == "entry_from_zeros" and i:
            entry = np.zeros_like(rec0)
        y, conv_after, rec_after, seg = layer_forward(cfg, params, xs[i], halos[i], entry, delta_rule="recurrent")
        M, U = summaries[i]
        for name, t in (("halo", halos[i]), ("M", M), ("U", U), ("entry_state", entry), ("out", y),
                        ("attn_out", seg["attn_out"]), ("conv_state", conv_after), ("recurrent_state", rec_after)):
            out[f"segments.{i}.{name}"] = np.ascontiguousarray(t, dtype=np.float64)
    return out


def reference_context_parallel(cfg: GDNConfig, weights, plan, rank: int, comm, xs, conv_state, recurrent_state, *,
                               profile: str = "f64", fault: str = "none", **options) -> dict[str, np.ndarray]:
    """The reference's ``context_parallel`` (the port contract's sharded method, gdncheck.harness.sharded):
    :func:`cp_rank` on ``comm``, in float64 whatever the profile (the context-parallel algebra is the
    reference's; ``fault``: one of :data:`CP_FAULTS`, for tests)."""
    _check_fault(fault, CP_FAULTS)
    spec = {"cfg": cfg.to_hf(), "weights": {n: np.asarray(w) for n, w in weights.items()}, "plan": dict(plan),
            "conv_state": np.asarray(conv_state), "recurrent_state": np.asarray(recurrent_state), "fault": fault,
            "x": dict(xs)}
    return cp_rank(rank, int(plan["world"]), comm, spec)


def _host(t) -> np.ndarray:
    if hasattr(t, "detach"):
        import torch

        return t.detach().to("cpu", torch.float64).numpy()
    return np.asarray(t, dtype=np.float64)


PROGRAMS = {"tp": tp_rank, "cp": cp_rank}

__all__ = ["CP_FAULTS", "DistributedRunError", "TP_FAULTS", "cp_plan", "launch", "run_cp", "run_tp", "tp_plan"]
