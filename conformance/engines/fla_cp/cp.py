"""flash-linear-attention's context parallelism (``fla.ops.cp``) as a rank program (conformance/engines/fla_cp/README.md,
docs/sharding.md): its own ``causal_conv1d_cp`` and ``chunk_gated_delta_rule(..., cp_context=...)`` on each
rank of a gloo group, fed the goldens' stage inputs, judged segment by segment.

Glue only: the conv (with its halo exchange) and the delta rule (with its summary exchange and merge) are
fla's. Each rank gets its tokens as fla's layout gives them (``contiguous``: ``T/world`` each; ``zigzag``:
pieces r and ``2·world−1−r`` concatenated), the pre-conv ``qkv`` of those tokens, the conv weight, ``g`` and
``beta``; it writes per segment ``qkv_conv`` and ``core``. fla takes no entering state with a CP context,
so the call starts from the zero state.

On a CPU it runs under Triton's interpreter with four runtime patches, each one line of fla's behaviour
replaced while the run lasts and checked by tests/engines/fla_cp/test_fla_cp.py:

1. ``fla.ops.cp.context._check_cp_device`` (imported by name into ``fla.ops.cp.chunk_delta_h``,
   ``chunk_fwd``, ``chunk_merge``, ``chunk_bwd``) refuses any device but CUDA (sm ≥ 80) and Ascend:
   replaced by a no-op.
2. ``fla.ops.cp.comm.all_gather_into_tensor`` gathers into a stacked ``[world, ...]`` output, which
   gloo refuses: the same collective into a flat buffer, viewed as ``[world, ...]`` (in ``fla.ops.cp.comm``
   and where it is imported by name: ``fla.ops.cp``, ``chunk_delta_h``, ``fla.modules.causal_conv1d.cp``).
3. fla's kernels call ``i_t.to(tl.int64)`` on loop counters, Python ints under the interpreter: the
   chunk kernels' ``range`` yields ints that take ``.to`` (as the single-rank fla engine's adapter does).
4. Triton's autotuner benchmarks every config, which needs a GPU driver: it keeps the first config.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.sharding import CPPlan, plan_from_json


class _LoopCounter(int):
    """A Python loop counter that takes ``.to(dtype)`` as a Triton scalar does (patch 3)."""

    def to(self, *_args, **_kwargs) -> int:
        return int(self)


def _counting_range(*args):
    return (_LoopCounter(i) for i in range(*args))


#: the fla modules a patch replaces a name in (module docstring)
DEVICE_CHECK_USERS = ("fla.ops.cp.chunk_delta_h", "fla.ops.cp.chunk_fwd", "fla.ops.cp.chunk_merge",
                      "fla.ops.cp.chunk_bwd")
ALL_GATHER_USERS = ("fla.ops.cp.comm", "fla.ops.cp", "fla.ops.cp.chunk_delta_h", "fla.modules.causal_conv1d.cp")
RANGE_USERS = ("fla.ops.common.chunk_delta_h", "fla.ops.common.chunk_o", "fla.ops.cp.chunk_fwd",
               "fla.ops.cp.chunk_delta_h")


def _flat_all_gather(inp, out=None, group=None, async_op=False):
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group=group)
    flat = torch.empty(world * inp.numel(), device=inp.device, dtype=inp.dtype)
    handle = dist.all_gather_into_tensor(flat, inp.contiguous().reshape(-1), group=group, async_op=async_op)
    view = flat.view(world, *inp.shape)
    if out is not None:
        out.copy_(view)
        view = out
    return view, handle


@contextlib.contextmanager
def patched():
    """The four runtime patches of the module docstring, undone on exit."""
    import importlib

    from triton.runtime.autotuner import Autotuner

    saved = []

    def put(module_name: str, name: str, value) -> None:
        mod = importlib.import_module(module_name)
        saved.append((mod, name, vars(mod).get(name, _ABSENT)))
        setattr(mod, name, value)

    prune = Autotuner.prune_configs
    try:
        for m in DEVICE_CHECK_USERS:
            put(m, "_check_cp_device", lambda device: None)
        put("fla.ops.cp.context", "_check_cp_device", lambda device: None)
        for m in ALL_GATHER_USERS:
            put(m, "all_gather_into_tensor", _flat_all_gather)
        for m in RANGE_USERS:
            put(m, "range", _counting_range)
        Autotuner.prune_configs = lambda self, kwargs: prune(self, kwargs)[:1]
        yield
    finally:
        Autotuner.prune_configs = prune
        for mod, name, old in reversed(saved):
            if old is _ABSENT:
                delattr(mod, name)
            else:
                setattr(mod, name, old)


_ABSENT = object()

#: the glue's own mistakes a test makes it commit (each must fail the judge): the rank's zigzag pieces handed
#: to fla back first; rank r handed rank (world − 1 − r)'s tokens (ranks swapped); the plan read as the other
#: layout's split (contiguous handed to fla as zigzag, or the reverse)
GLUE_MUTANTS = ("none", "wrong_split", "ranks_swapped", "layout_misread")


def local_order(plan: CPPlan, rank: int) -> list[int]:
    """The plan's segments rank ``rank`` holds, in the order fla's local buffer concatenates them."""
    return [i for i, (r, _, _) in enumerate(plan.segments) if r == rank]


def fla_cp_rank(rank: int, world: int, dist, spec: dict) -> dict[str, np.ndarray]:
    """The rank program (:func:`gdncheck.conformance.ports.distributed.launch`): fla's CP conv and delta rule
    on this rank's tokens. ``spec``: ``cfg``, ``plan`` (a CP plan fla's layout gives), ``qkv`` and ``g``,
    ``beta`` per segment (``{i: [1, L, ...]}``), ``conv_weight`` [conv_dim, K]; ``glue``: ``none``, or a glue
    mutant (:data:`GLUE_MUTANTS`, tests only)."""
    import torch

    if not torch.cuda.is_available():  # before fla imports triton: its kernels interpreted on a CPU
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from fla.modules.causal_conv1d.cp import causal_conv1d_cp
    from fla.ops.cp import build_cp_context
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    cfg = GDNConfig.from_hf(spec["cfg"])
    plan = plan_from_json(spec["plan"], cfg)
    glue = spec.get("glue", "none")
    if glue not in GLUE_MUTANTS:
        raise ValueError(f"expected a glue among {', '.join(GLUE_MUTANTS)}, found {glue!r}")
    mine = local_order(plan, rank)
    if glue == "wrong_split":  # the rank's pieces concatenated back first
        mine = mine[::-1]
    if glue == "ranks_swapped":  # rank r handed rank (world − 1 − r)'s tokens, written as its own
        fed, mine = local_order(plan, world - 1 - rank), mine
    else:
        fed = mine
    layout = plan.layout
    if glue == "layout_misread":  # the plan read as the other layout's split
        layout = "zigzag" if plan.layout == "contiguous" else "contiguous"

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(np.concatenate([a[i] for i in fed], axis=1), dtype=np.float32))

    qkv, g, beta = t(spec["qkv"]), t(spec["g"]), t(spec["beta"])
    weight = torch.from_numpy(np.asarray(spec["conv_weight"], dtype=np.float32))
    group = dist.group.WORLD
    cu = torch.tensor([0, plan.T], dtype=torch.int32)
    with patched(), torch.no_grad():
        ctx = build_cp_context(cu, group, conv1d_kernel_size=cfg.conv_kernel, cu_seqlens_cpu=cu, layout=layout)
        conv = causal_conv1d_cp(qkv, weight, activation="silu", cp_context=ctx)
        kd = cfg.key_dim
        L = conv.shape[1]
        q = conv[..., :kd].reshape(1, L, cfg.num_k_heads, cfg.head_k_dim)
        k = conv[..., kd:2 * kd].reshape(1, L, cfg.num_k_heads, cfg.head_k_dim)
        v = conv[..., 2 * kd:].reshape(1, L, cfg.num_v_heads, cfg.head_v_dim)
        core, _ = chunk_gated_delta_rule(q, k, v, g=g, beta=beta, scale=cfg.scale, use_qk_l2norm_in_kernel=True,
                                         cu_seqlens=ctx.cu_seqlens, cp_context=ctx)
    out, at = {}, 0
    for i, j in zip(mine, fed, strict=True):  # the tokens of segment j, written as segment i's
        n = plan.segments[j][2] - plan.segments[j][1]
        out[f"segments.{i}.qkv_conv"] = conv[:, at:at + n].double().numpy()
        out[f"segments.{i}.core"] = core[:, at:at + n].double().numpy()
        at += n
    return out


def fla_cp_spec(cfg: GDNConfig, plan: CPPlan, weights, trace, glue: str = "none") -> dict:
    """The spec of :func:`fla_cp_rank` for one call of batch 1 whose unsharded reference trace is ``trace``
    (its stage inputs: ``qkv``, ``g``, ``beta``): each segment's rows of them."""
    seg = {name: {i: np.asarray(trace[name])[:, a:b] for i, (_, a, b) in enumerate(plan.segments)}
           for name in ("qkv", "g", "beta")}
    w = np.asarray(weights["linear_attn.conv1d.weight"], dtype=np.float64)
    return {"cfg": cfg.to_hf(), "plan": plan.to_json(), **seg, "conv_weight": w.reshape(w.shape[0], w.shape[-1]),
            "glue": glue}


def fla_cp_jobs(rank: int, world: int, dist, spec: dict) -> dict[str, np.ndarray]:
    """Several :func:`fla_cp_rank` runs in one launch (tests and measurements: a launch costs ~17 s of spawning
    and imports here, fla's first interpreted call ~16 s, a later one ~5 s): ``spec["jobs"]``, a list of
    :func:`fla_cp_spec` specs (same world); rank ``rank``'s tensors of job ``n`` prefixed ``j{n}.``."""
    out = {}
    for n, job in enumerate(spec["jobs"]):
        out.update({f"j{n}.{k}": v for k, v in fla_cp_rank(rank, world, dist, job).items()})
    return out
