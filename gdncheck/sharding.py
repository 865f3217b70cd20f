"""Partition plans: which heads, channels and tokens each rank of a sharded layer owns (docs/sharding.md).

Data, not math: the float64 reference (``reference/sharded.py``), the Triton path and every port read
the same plan, and a manifest carries it as JSON (:meth:`TPPlan.to_json`, :func:`plan_from_json`) so
that a port in any language reads its rank's share.

**Tensor parallelism** (:func:`tp_plan`) splits the *value* heads into one contiguous range per rank:
evenly (``Hv / world`` each) or unevenly with the counts given explicitly (vLLM PR 47759 splits
Qwen3.5's heads 3 ways). A rank owns every key head its value heads read (value head j reads key head
``j // (Hv/Hk)``, as ``repeat_interleave``), so past the key-head count, or where a range cuts a group,
a key head is *replicated* on the ranks that share it. From the heads follow, per rank:

- the conv channels of each segment of ``[Q | K | V]``: ``q`` = ``k_heads·dk``, ``k`` = ``Hk·dk +
  k_heads·dk``, ``v`` = ``2·Hk·dk + v_heads·dv`` (the packed projection is split *per segment*,
  never as one block);
- the rows of ``in_proj_qkv`` (those channels), ``in_proj_z`` (``v_heads·dv``), ``in_proj_a`` and
  ``in_proj_b`` (``v_heads``), the entries of ``A_log`` and ``dt_bias`` (``v_heads``), the conv weight's
  rows (the channels), ``norm.weight`` (whole when shared by every head, ``v_heads·dv`` when per head),
  and the columns ``v_heads·dv`` of ``out_proj``;
- its state shards: ``conv_state[:, channels, :]`` and ``recurrent_state[:, v_heads]``.

The layer's ``attn_out`` is the sum of the ranks' ``out_proj`` partials (the all-reduce).

**Context parallelism** (:func:`cp_plan`) splits one call's tokens into segments: ``contiguous`` (one
range a rank, in rank order, even or with explicit boundaries) or ``zigzag`` (``2·world`` equal pieces;
rank r owns pieces r and ``2·world−1−r``). The state flows through the segments in token order, so in
zigzag rank 0's second piece comes last.

**Tensor × context parallelism** (:func:`tpcp_plan`) combines one plan of each over ``tp·cp`` ranks,
numbered tensor-parallel rank fastest (as Megatron-LM numbers them): rank ``r`` is TP rank ``r mod tp``
of CP rank ``r div tp``, and owns that TP share's heads and channels on that CP rank's segments. Its
context-parallel group (halos and summaries exchanged) is the ranks of its TP rank; its tensor-parallel
group (the all-reduce of its partials over its tokens) the ranks of its CP rank.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.errors import ShardPlanError

PLAN_FORMAT = 1
CP_LAYOUTS = ("contiguous", "zigzag")
#: the most ranks a plan may name (a 4096-way split of Qwen3.5's 32 heads is nonsense, and a plan is
#: untrusted JSON: a world of 10^9 must not allocate)
MAX_WORLD = 1024


def _whole(value, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not low <= int(value) <= high:
        raise ShardPlanError(f"expected {what} a whole number in [{low}, {high}], found {repr(value)[:40]}")
    return int(value)


@dataclass(frozen=True)
class RankShare:
    """What one tensor-parallel rank owns: value heads ``[v_start, v_stop)``, key heads ``[k_start, k_stop)``."""

    rank: int
    v_start: int
    v_stop: int
    k_start: int
    k_stop: int

    @property
    def v_heads(self) -> range:
        return range(self.v_start, self.v_stop)

    @property
    def k_heads(self) -> range:
        return range(self.k_start, self.k_stop)

    def key_of_value(self, cfg: GDNConfig) -> np.ndarray:
        """For each of the rank's value heads, the index of its key head *among the rank's key heads*."""
        return np.array([j // cfg.head_ratio - self.k_start for j in self.v_heads], dtype=np.int64)

    def segments(self, cfg: GDNConfig) -> dict[str, tuple[int, int]]:
        """The conv channels ``[start, stop)`` of each segment ``q``, ``k``, ``v`` (global channel indices)."""
        dk, dv, key_dim = cfg.head_k_dim, cfg.head_v_dim, cfg.key_dim
        return {
            "q": (self.k_start * dk, self.k_stop * dk),
            "k": (key_dim + self.k_start * dk, key_dim + self.k_stop * dk),
            "v": (2 * key_dim + self.v_start * dv, 2 * key_dim + self.v_stop * dv),
        }

    def conv_channels(self, cfg: GDNConfig) -> np.ndarray:
        """The rank's conv channels in order ``q | k | v``: its rows of ``in_proj_qkv`` and of the conv weight."""
        return np.concatenate([np.arange(a, b) for a, b in self.segments(cfg).values()])

    def value_channels(self, cfg: GDNConfig) -> np.ndarray:
        """``v_heads·dv``: its rows of ``in_proj_z`` and columns of ``out_proj``."""
        return np.arange(self.v_start * cfg.head_v_dim, self.v_stop * cfg.head_v_dim)

    def to_json(self) -> dict:
        return {"rank": self.rank, "v_heads": [self.v_start, self.v_stop], "k_heads": [self.k_start, self.k_stop]}


@dataclass(frozen=True)
class TPPlan:
    """A tensor-parallel plan: one :class:`RankShare` per rank, value heads contiguous in rank order."""

    world: int
    shares: tuple[RankShare, ...]

    @property
    def kind(self) -> str:
        """``even`` (equal value heads, disjoint key heads), ``uneven`` (counts differ, key heads disjoint)
        or ``replicated_keys`` (some key head on more than one rank)."""
        keys = [h for s in self.shares for h in s.k_heads]
        if len(keys) != len(set(keys)):
            return "replicated_keys"
        return "even" if len({s.v_stop - s.v_start for s in self.shares}) == 1 else "uneven"

    def to_json(self) -> dict:
        return {"kind": "tp", "format": PLAN_FORMAT, "world": self.world, "split": self.kind,
                "ranks": [s.to_json() for s in self.shares]}


def tp_plan(cfg: GDNConfig, world: int, v_heads_per_rank=None) -> TPPlan:
    """The tensor-parallel plan of ``cfg`` over ``world`` ranks.

    ``v_heads_per_rank``: the value heads of each rank (positive, summing to Hv), for an uneven split;
    default an even split, refused (:class:`ShardPlanError`) where Hv is not a multiple of ``world``.
    """
    hv = cfg.num_v_heads
    world = _whole(world, "a tensor-parallel world size", 1, min(MAX_WORLD, hv))
    if v_heads_per_rank is None:
        if hv % world:
            raise ShardPlanError(f"expected a world size dividing the {hv} value heads for an even split, found "
                                 f"{world}: give the value heads of each rank for an uneven one")
        counts = [hv // world] * world
    else:
        if not isinstance(v_heads_per_rank, list | tuple) or len(v_heads_per_rank) != world:
            raise ShardPlanError(f"expected {world} value-head counts (one a rank), found {str(v_heads_per_rank)[:60]}")
        counts = [_whole(c, f"rank {r}'s value heads", 1, hv) for r, c in enumerate(v_heads_per_rank)]
        if sum(counts) != hv:
            raise ShardPlanError(f"expected value-head counts summing to {hv}, found {counts} (sum {sum(counts)})")
    shares, start = [], 0
    for rank, n in enumerate(counts):
        stop = start + n
        shares.append(RankShare(rank, start, stop, start // cfg.head_ratio, (stop - 1) // cfg.head_ratio + 1))
        start = stop
    return TPPlan(world, tuple(shares))


#: the GDN weights a rank holds a part of (the rest, the norms and the MLP, are replicated)
QKV, Z, A, B = ("linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight", "linear_attn.in_proj_a.weight",
                "linear_attn.in_proj_b.weight")
CONV, A_LOG, DT_BIAS = "linear_attn.conv1d.weight", "linear_attn.A_log", "linear_attn.dt_bias"
NORM, OUT = "linear_attn.norm.weight", "linear_attn.out_proj.weight"


def rank_weights(cfg: GDNConfig, weights, share: RankShare) -> dict[str, np.ndarray]:
    """The weights rank ``share.rank`` holds, as float64 arrays: its rows of the projections and of the conv
    weight, its entries of A_log and dt_bias, ``norm.weight`` (whole when shared by the heads, its heads'
    part when per head), its columns of ``out_proj``; every other weight (the norms, the MLP) whole."""
    ch, vc, heads = share.conv_channels(cfg), share.value_channels(cfg), np.arange(share.v_start, share.v_stop)
    w = {name: np.asarray(arr, dtype=np.float64) for name, arr in weights.items()}
    norm = w[NORM]
    w.update({QKV: w[QKV][ch], Z: w[Z][vc], A: w[A][heads], B: w[B][heads], CONV: w[CONV][ch],
              A_LOG: w[A_LOG][heads], DT_BIAS: w[DT_BIAS][heads],
              NORM: norm if norm.size == cfg.head_v_dim else norm.reshape(-1)[vc], OUT: w[OUT][:, vc]})
    return w


def state_shards(cfg: GDNConfig, share: RankShare, conv_state, recurrent_state) -> tuple[np.ndarray, np.ndarray]:
    """A rank's shards of a state: ``conv_state[:, its channels, :]``, ``recurrent_state[:, its value heads]``."""
    return (np.asarray(conv_state, dtype=np.float64)[:, share.conv_channels(cfg), :].copy(),
            np.asarray(recurrent_state, dtype=np.float64)[:, share.v_start:share.v_stop].copy())


def standalone(cfg: GDNConfig, share: RankShare, weights) -> tuple[GDNConfig, dict[str, np.ndarray], np.ndarray]:
    """Rank ``share.rank`` as a plain (unsharded) GDN layer, for a port whose layer takes a config and
    weights: ``(cfg_r, weights_r, conv_index)``.

    Where the rank's value heads read its key heads as ``repeat_interleave`` does (every even split, and
    uneven ones on group edges) ``cfg_r`` has its key and value heads; elsewhere (a range cutting a key
    group unevenly) each value head gets its own copy of its key head (``Hk_r = Hv_r``). ``conv_index``
    maps the layer's conv channels to the share's (:meth:`RankShare.conv_channels`): the layer's conv state
    is ``shard[:, conv_index]``, and the share's is read back from the first layer channel of each."""
    kv = share.key_of_value(cfg)
    nk, nv = share.k_stop - share.k_start, share.v_stop - share.v_start
    aligned = nv % nk == 0 and np.array_equal(kv, np.repeat(np.arange(nk), nv // nk))
    heads = np.arange(nk) if aligned else kv  # the layer's key heads, among the rank's
    dk, dv = cfg.head_k_dim, cfg.head_v_dim
    within = (heads[:, None] * dk + np.arange(dk)).reshape(-1)  # q (and k) channels, within the share's q segment
    conv_index = np.concatenate([within, nk * dk + within, 2 * nk * dk + np.arange(nv * dv)])
    w = rank_weights(cfg, weights, share)
    w[QKV], w[CONV] = w[QKV][conv_index], w[CONV][conv_index]
    return cfg.replace(num_k_heads=len(heads), num_v_heads=nv), w, conv_index


@dataclass(frozen=True)
class CPPlan:
    """A context-parallel plan of one call of ``T`` tokens: segments ``(rank, start, stop)`` in token order."""

    T: int
    world: int
    layout: str
    segments: tuple[tuple[int, int, int], ...]

    def ranges(self, rank: int) -> list[tuple[int, int]]:
        """The token ranges ``[start, stop)`` rank ``rank`` owns, in token order."""
        return [(a, b) for r, a, b in self.segments if r == rank]

    def to_json(self) -> dict:
        return {"kind": "cp", "format": PLAN_FORMAT, "world": self.world, "layout": self.layout, "T": self.T,
                "segments": [{"rank": r, "tokens": [a, b]} for r, a, b in self.segments]}


def cp_plan(T: int, world: int, layout: str = "contiguous", boundaries=None) -> CPPlan:
    """The context-parallel plan of a call of ``T`` tokens over ``world`` ranks.

    ``contiguous``: rank r owns ``[boundaries[r], boundaries[r+1])`` with ``boundaries`` the ``world − 1``
    inner cut points (strictly increasing, inside ``(0, T)``), default ``ceil`` splits. ``zigzag``: ``2·world``
    pieces as equal as may be (the first ``T mod 2w`` one token longer); rank r owns pieces r and ``2w−1−r``.
    Every rank owns at least one token.
    """
    world = _whole(world, "a context-parallel world size", 1, MAX_WORLD)
    T = _whole(T, "a token count", world if layout != "zigzag" else 2 * world, 1 << 40)
    if layout not in CP_LAYOUTS:
        raise ShardPlanError(f"expected a layout among {', '.join(CP_LAYOUTS)}, found {str(layout)[:40]!r}")
    if layout == "contiguous":
        if boundaries is None:
            step = -(-T // world)
            cuts = [min(T - (world - 1 - r), (r + 1) * step) for r in range(world - 1)]
        else:
            if not isinstance(boundaries, list | tuple) or len(boundaries) != world - 1:
                raise ShardPlanError(f"expected {world - 1} inner token boundaries, found {str(boundaries)[:60]}")
            cuts = [_whole(c, "a token boundary", 1, T - 1) for c in boundaries]
        edges = [0, *cuts, T]
        if any(b <= a for a, b in zip(edges, edges[1:])):
            raise ShardPlanError(f"expected strictly increasing boundaries inside (0, {T}), found {cuts}")
        segments = tuple((r, edges[r], edges[r + 1]) for r in range(world))
    else:
        if boundaries is not None:
            raise ShardPlanError("expected no boundaries with the zigzag layout (its pieces are equal), found some")
        n = 2 * world
        sizes = [T // n + (1 if i < T % n else 0) for i in range(n)]
        starts = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        owner = [i if i < world else n - 1 - i for i in range(n)]
        segments = tuple((owner[i], int(starts[i]), int(starts[i + 1])) for i in range(n))
    return CPPlan(T, world, layout, segments)


#: how a tensor × context-parallel plan numbers its ranks (the only order gdncheck writes or reads)
TPCP_ORDER = "tp_fastest"


@dataclass(frozen=True)
class TPCPPlan:
    """Tensor × context parallelism over ``tp.world · cp.world`` ranks, TP rank fastest: rank ``r`` is TP rank
    ``r % tp.world`` (its heads: ``tp.shares[...]``) of CP rank ``r // tp.world`` (its segments of ``cp``)."""

    tp: TPPlan
    cp: CPPlan

    @property
    def world(self) -> int:
        return self.tp.world * self.cp.world

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp.world

    def cp_rank(self, rank: int) -> int:
        return rank // self.tp.world

    def share(self, rank: int) -> RankShare:
        """The heads and channels rank ``rank`` owns (its TP rank's share)."""
        return self.tp.shares[self.tp_rank(rank)]

    def rank_of(self, tp_rank: int, cp_rank: int) -> int:
        return cp_rank * self.tp.world + tp_rank

    def cp_group(self, rank: int) -> list[int]:
        """The ranks exchanging halos and summaries with ``rank`` (its TP rank's), in CP rank order."""
        return [self.rank_of(self.tp_rank(rank), c) for c in range(self.cp.world)]

    def tp_group(self, rank: int) -> list[int]:
        """The ranks whose partials ``rank``'s all-reduce sums (its CP rank's), in TP rank order."""
        return [self.rank_of(t, self.cp_rank(rank)) for t in range(self.tp.world)]

    def to_json(self) -> dict:
        return {"kind": "tpcp", "format": PLAN_FORMAT, "world": self.world, "order": TPCP_ORDER,
                "tp": self.tp.to_json(), "cp": self.cp.to_json(),
                "ranks": [{"rank": r, "tp_rank": self.tp_rank(r), "cp_rank": self.cp_rank(r)}
                          for r in range(self.world)]}


def tpcp_plan(tp: TPPlan, cp: CPPlan) -> TPCPPlan:
    """Tensor parallelism ``tp`` times context parallelism ``cp``: ``tp.world · cp.world`` ranks, TP rank fastest."""
    if not isinstance(tp, TPPlan) or not isinstance(cp, CPPlan):
        raise ShardPlanError(f"expected a tensor-parallel and a context-parallel plan, found {type(tp).__name__} and "
                             f"{type(cp).__name__}")
    _whole(tp.world * cp.world, "a tensor × context-parallel world size", 1, MAX_WORLD)
    return TPCPPlan(tp, cp)


def plan_from_json(data, cfg: GDNConfig | None = None):
    """A :class:`TPPlan`, :class:`CPPlan` or :class:`TPCPPlan` from its JSON form (a manifest's), checked
    against how it is made: a plan whose ranks do not equal what :func:`tp_plan` / :func:`cp_plan` /
    :func:`tpcp_plan` give for its own parameters is refused, so a port reading it and gdncheck agree on
    every rank's share."""
    if isinstance(data, str | bytes):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise ShardPlanError(f"expected a plan as JSON, found text that does not parse ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") not in ("tp", "cp", "tpcp"):
        raise ShardPlanError(f"expected a plan object with kind 'tp', 'cp' or 'tpcp', found {str(data)[:60]}")
    if data.get("format") != PLAN_FORMAT:
        raise ShardPlanError(f"expected plan format {PLAN_FORMAT}, found {str(data.get('format'))[:20]!r}")
    try:
        if data["kind"] == "tpcp":
            if data["order"] != TPCP_ORDER:
                raise ShardPlanError(f"expected a tpcp plan's order {TPCP_ORDER!r} (TP rank fastest), found "
                                     f"{str(data['order'])[:30]!r}")
            tp, cp = plan_from_json(data["tp"], cfg), plan_from_json(data["cp"], cfg)
            if not (isinstance(tp, TPPlan) and isinstance(cp, CPPlan)):
                raise ShardPlanError("expected a tpcp plan's tp a tensor-parallel plan and its cp a context-parallel "
                                     "one, found other kinds")
            plan = tpcp_plan(tp, cp)
        elif data["kind"] == "tp":
            if cfg is None:
                raise ShardPlanError("a tensor-parallel plan needs the layer's config to be checked")
            ranks = data["ranks"]
            counts = [r["v_heads"][1] - r["v_heads"][0] for r in ranks]
            plan = tp_plan(cfg, data["world"], counts)
        else:
            segs = data["segments"]
            cuts = [s["tokens"][0] for s in segs[1:]] if data["layout"] == "contiguous" else None
            plan = cp_plan(data["T"], data["world"], data["layout"], cuts)
    except (KeyError, TypeError, IndexError) as exc:
        raise ShardPlanError(f"expected a complete {data['kind']} plan, found one lacking {exc}") from None
    if plan.to_json() != data:
        raise ShardPlanError(f"expected the {data['kind']} plan its own parameters give, found one that differs "
                             f"(a rank's heads or tokens edited)")
    return plan


def share_order(conv_index: np.ndarray, n: int) -> np.ndarray:
    """For each of a share's ``n`` conv channels, the first channel of its standalone layer holding it
    (:func:`standalone`'s ``conv_index``): ``layer_tensor[..., share_order]`` is the share's."""
    return np.array([int(np.flatnonzero(conv_index == c)[0]) for c in range(n)], dtype=np.int64)


class SubGroup:
    """The collectives of some ranks of a world (a tensor × context-parallel plan's CP or TP group), through the
    world's ``all_gather_object``: every rank of the world calls it the same number of times (the rank programs
    of every group make the same collectives), and each keeps its members' parts, in member order."""

    def __init__(self, comm, world: int, members: list[int]):
        self.comm, self.world, self.members = comm, world, list(members)

    def all_gather_object(self, parts: list, obj) -> None:
        every: list = [None] * self.world
        self.comm.all_gather_object(every, obj)
        parts[:] = [every[m] for m in self.members]


def gathered(comm, world: int, mine: dict) -> dict:
    """Every rank's dict merged, through ``comm.all_gather_object`` (as ``torch.distributed``): what each rank of a
    context-parallel plan sent (its halos' rows, its summaries), by segment. Not math: the exchange both the
    reference's and the Triton path's context parallelism make."""
    parts: list = [None] * world
    comm.all_gather_object(parts, mine)
    merged: dict = {}
    for part in parts:
        merged.update(part)
    return merged

