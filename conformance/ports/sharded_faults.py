"""The field's sharding bugs as ports (docs/sharding.md): the reference with its ``tensor_parallel`` and
``context_parallel`` methods (docs/plugins.md) committing one fault of :data:`~.distributed.TP_FAULTS`,
:data:`~.distributed.CP_FAULTS` or :data:`PADDING_FAULTS`; the kill matrix's sharding mutants
(``gdncheck.conformance.meta.sharding_mutants``) and the tests run them.

**Padded ranks** (:func:`padded_ranks`). vLLM PR 47759 runs Qwen3.5 at an uneven TP 3 by padding: every
rank holds ``max(counts)`` head slots (``padded_local_value_dim``, ``ExplicitPaddedRowParallelLinear``), the
slots past its real heads padding. A padding slot must be inert (local-inference-lab/vllm PR 601, TP 3
head padding: "padded heads have q = k = v = 0 so their state stays zero", their ``o_proj`` columns
zero). Padding is the port's own layout: the rank still writes only its real heads (docs/sharding.md).
``fill="zero"`` pads as those PRs do (it conforms); ``fill="wrap"`` fills the slots through a head index
that wraps (``slot % n_real``) instead of masking them, so each padding slot is a copy of a real head, its
``out_proj`` columns included, and the rank's partial counts that head twice (fault
``padding_head_leaks``): every tensor the rank writes is right but its ``out_proj`` partial."""

from __future__ import annotations

from functools import partial

import numpy as np

from gdncheck.harness.contract import to_numpy
from gdncheck.harness.sharded import RankImplementation, standalone_ranks
from gdncheck.sharding import A_LOG, CONV, DT_BIAS, NORM, OUT, QKV, A, B, RankShare, Z, plan_from_json, rank_weights
from gdncheck.weights import LayerWeights

from .distributed import CP_FAULTS, TP_FAULTS, reference_context_parallel
from .implementations import reference

#: faults of a port's own layout (a padded rank), which the distributed rank programs do not commit
PADDING_FAULTS = ("padding_head_leaks",)
PAD_FILLS = ("zero", "wrap")


def padded_layer(cfg, share: RankShare, weights, slots: int, fill: str):
    """Rank ``share.rank`` as a plain layer of ``slots`` head slots (``slots`` ≥ its value heads ``n``): slot
    ``s < n`` its value head ``s``, each slot with its own copy of the key head it reads (``Hk = Hv = slots``).
    The slots past ``n`` are padding: ``fill="zero"`` zero rows and ``out_proj`` columns (inert), ``"wrap"``
    a copy of real head ``s % n``. Returns ``(cfg_p, weights_p, conv_index)``, ``conv_index`` each layer conv
    channel's channel in the share (−1: a zero padding channel), as :func:`gdncheck.sharding.standalone`'s."""
    if fill not in PAD_FILLS:
        raise ValueError(f"expected a padding fill among {', '.join(PAD_FILLS)}, found {fill!r}")
    n, nk = share.v_stop - share.v_start, share.k_stop - share.k_start
    if slots < n:
        raise ValueError(f"expected at least rank {share.rank}'s {n} value heads as slots, found {slots}")
    dk, dv = cfg.head_k_dim, cfg.head_v_dim
    real = np.array([s if s < n else (s % n if fill == "wrap" else -1) for s in range(slots)])
    pad = real < 0
    src = np.where(pad, 0, real)  # a zero slot reads head 0's rows, then zeroed
    kv = share.key_of_value(cfg)[src]

    def per_slot(index_of):  # the share-local channels of every slot, -1 where a zero slot's
        return np.concatenate([np.where(pad[s], -1, index_of(s)) for s in range(slots)])

    conv_index = np.concatenate([per_slot(lambda s: kv[s] * dk + np.arange(dk)),
                                 per_slot(lambda s: nk * dk + kv[s] * dk + np.arange(dk)),
                                 per_slot(lambda s: 2 * nk * dk + src[s] * dv + np.arange(dv))])
    w = rank_weights(cfg, weights, share)
    ch = np.where(conv_index < 0, 0, conv_index)
    vch = (src[:, None] * dv + np.arange(dv)).reshape(-1)
    vpad = np.repeat(pad, dv)
    out = {QKV: w[QKV][ch], CONV: w[CONV][ch], Z: w[Z][vch], OUT: w[OUT][:, vch],
           A: w[A][src], B: w[B][src], A_LOG: w[A_LOG][src], DT_BIAS: w[DT_BIAS][src]}
    for name in (QKV, CONV):
        out[name][conv_index < 0] = 0.0
    out[Z][vpad] = 0.0
    out[OUT][:, vpad] = 0.0
    for name in (A, B, A_LOG, DT_BIAS):
        out[name][pad] = 0.0
    norm = w[NORM]
    if norm.size != dv:  # per head: its slots' parts (a zero slot's norm weight is never reached: z = 0)
        out[NORM] = norm.reshape(n, dv)[src].reshape(-1)
    w.update(out)
    return cfg.replace(num_k_heads=slots, num_v_heads=slots), w, conv_index


class PaddedRank(RankImplementation):
    """A rank run as a layer of padded head slots (:func:`padded_layer`) that writes only its ``n`` real
    heads: its conv channels read back from each channel's first slot, its per-head tensors and recurrent
    state the first ``n`` slots."""

    def __init__(self, impl, cfg, share: RankShare, conv_index: np.ndarray):
        super().__init__(impl, cfg, share, conv_index)
        self._n = share.v_stop - share.v_start

    def _share(self, out, trace):
        out, t = super()._share(out, trace)
        for name in ("g", "beta"):
            if name in t:
                t[name] = np.asarray(t[name])[..., :self._n]
        for name in ("core", "core_gated"):
            if name in t:
                t[name] = np.asarray(t[name])[..., :self._n, :]
        return out, t

    def state_arrays(self, state):
        arrays = super().state_arrays(state)
        arrays["recurrent_state"] = np.asarray(to_numpy(arrays["recurrent_state"]))[:, :self._n]
        return arrays


def padded_ranks(factory, fill: str = "zero"):
    """A ``tensor_parallel`` method from a plain layer's factory, each rank a layer of ``max(counts)`` head
    slots (vLLM PR 47759's uneven TP), its padding filled by ``fill`` (:func:`padded_layer`)."""

    def tensor_parallel(cfg, weights, plan, rank: int, *, profile: str, strict: bool = False, **options):
        p = plan_from_json(plan, cfg)
        share = p.shares[rank]
        slots = max(s.v_stop - s.v_start for s in p.shares)
        cfg_p, w_p, conv_index = padded_layer(cfg, share, weights, slots, fill)
        w_p = LayerWeights({n: np.asarray(a, dtype=np.float32) for n, a in w_p.items()}, config=cfg_p,
                           source=f"rank {rank}'s share, {slots} head slots")
        impl = factory(cfg_p, w_p, profile=profile, strict=strict, **options)
        return PaddedRank(impl, cfg, share, conv_index)

    return tensor_parallel


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
    known = TP_FAULTS + CP_FAULTS + PADDING_FAULTS
    if fault not in known:
        raise ValueError(f"expected a fault among {', '.join(dict.fromkeys(known))}, found {fault!r}")

    def factory(cfg, weights, **kw):
        return reference(cfg, weights, **kw)

    if fault == "padding_head_leaks":
        factory.tensor_parallel = padded_ranks(reference, "wrap")
    else:
        factory.tensor_parallel = _tensor_parallel(fault if fault in TP_FAULTS else "none")
    factory.context_parallel = partial(reference_context_parallel, fault=fault if fault in CP_FAULTS else "none")
    factory.__name__ = fault
    return factory


def padded_port(fill: str = "zero"):
    """The reference as a port whose tensor-parallel ranks are padded to ``max(counts)`` head slots, the
    padding filled by ``fill`` (``zero``: inert, as it must be; ``wrap``: :data:`PADDING_FAULTS`)."""

    def factory(cfg, weights, **kw):
        return reference(cfg, weights, **kw)

    factory.tensor_parallel = padded_ranks(reference, fill)
    factory.context_parallel = reference_context_parallel
    factory.__name__ = f"padded_{fill}"
    return factory
