"""What a gate run runs: the cases per profile, the property units, and what it skips (and why).

Selection is deterministic. ``--case``/``--tag``/``--shard I/N`` pick cases exactly as ``gdncheck run``
and ``verify`` do (:func:`gdncheck.fixtures.manifest.select_cases`: every N-th case of the manifest
from the I-th), so a CI matrix of N gates covers every case once and ``verify --shard`` re-checks
the same ones. Property units ``(property, profile)`` are split over the shards the same way, by
their position in the sorted list.

On Triton's interpreter (the Triton path on a machine without a GPU) the cases tagged
:data:`INTERPRETER_SKIP_TAGS` with more than :data:`INTERPRETER_MAX_CALLS` layer calls are not run:
each is listed as skipped, with the reason, in the console, the JSON summary and the JUnit file, never
dropped silently. ``all_cases`` runs them anyway; on a GPU everything runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gdncheck.fixtures.manifest import select_cases

#: A case tagged ``long`` with more layer calls than this does not run under the interpreter by default:
#: ~0.1 s an interpreted call makes the 2048-token decode about 3.5 minutes a profile. The real-size long
#: decode (d128-long-decode: 193 calls, 8.6 s a profile measured 2026-12-05) runs.
INTERPRETER_MAX_CALLS = 1000
INTERPRETER_SKIP_TAGS = ("long",)


def interpreter_skip_reason(entry: dict) -> str | None:
    """Why a case does not run under the interpreter by default, or None where it runs."""
    if not set(INTERPRETER_SKIP_TAGS) & set(entry.get("tags", [])):
        return None
    n = call_count(entry)
    if n <= INTERPRETER_MAX_CALLS:
        return None
    return (f"{n} layer calls take about {n * 0.1 / 60:.1f} minutes per profile under Triton's interpreter "
            "(~0.1 s a call); it runs on a GPU, or here with --all-cases")


@dataclass(frozen=True)
class CaseUnit:
    """One case run in one profile."""

    case: str
    profile: str
    cost: float  # estimated relative cost (layer calls), for scheduling and the progress bar


@dataclass(frozen=True)
class PropertyUnit:
    """One property searched in one profile."""

    name: str
    profile: str
    cost: float


@dataclass
class Skip:
    case: str
    profiles: list[str]
    reason: str

    def to_json(self) -> dict:
        return {"case": self.case, "profiles": self.profiles, "reason": self.reason}


@dataclass
class Plan:
    entries: list[dict]  # manifest entries of the cases that run
    case_units: list[CaseUnit]
    property_units: list[PropertyUnit]
    skipped: list[Skip] = field(default_factory=list)
    selected: int = 0  # cases selected before the interpreter skip

    @property
    def case_ids(self) -> list[str]:
        return [e["id"] for e in self.entries]


def call_count(entry: dict) -> int:
    """Layer calls a case's program makes (a ``decode`` step of T tokens is T calls)."""
    n = 0
    for step in entry["program"]:
        if step["op"] in ("forward", "forward_packed", "prefix_snapshots", "verify_spec"):
            n += 1
        elif step["op"] == "forward_mixed":  # a verify of its verify rows and a packed call of the others
            n += 2 if 0 in step["verify"] and 1 in step["verify"] else 1
        elif step["op"] == "decode":
            n += int(step["T"])
    return n


def case_cost(entry: dict) -> float:
    """Relative cost of running one case once: about one unit per layer call (an interpreted call
    costs about the same whatever its size), a little for the rest."""
    return 0.2 + call_count(entry)


def plan_cases(manifest: dict, profiles: list[str], *, cases: list[str] | None = None,
               tags: list[str] | None = None, shard: tuple[int, int] | None = None, interpreter: bool = False,
               all_cases: bool = False) -> tuple[list[dict], list[CaseUnit], list[Skip], int]:
    entries = select_cases(manifest, cases, tags, shard)
    selected = len(entries)
    skipped: list[Skip] = []
    if interpreter and not all_cases:
        keep = []
        for e in entries:
            reason = interpreter_skip_reason(e)
            if reason:
                skipped.append(Skip(e["id"], list(profiles), f"skipped on the interpreter: {reason}"))
            else:
                keep.append(e)
        entries = keep
    units = [CaseUnit(e["id"], p, case_cost(e)) for p in profiles for e in entries]
    return entries, units, skipped, selected


#: A property unit's relative cost (the properties run last, most expensive first, so that the small
#: ones even out the workers' ends): its interpreted layer calls, measured on the Triton path in f32
#: (2 examples, ci profile, 2026-12-07: CPU-seconds x 4). batch_independence is the largest: one of
#: its examples is a 3-row call of more than 16 tokens, the chunked delta rule. Others: 4.
PROPERTY_COSTS = {"batch_independence": 16.0, "differential": 6.0, "chunk_size_invariance": 5.0,
                  "decode_equals_prefill": 5.0, "snapshot_round_trip": 5.0, "padding_and_other_slots_untouched": 5.0,
                  "split_invariance": 4.5, "orthonormal_recall": 0.3, "configuration_errors": 0.1}


def plan_properties(names: list[str], profiles: list[str], shard: tuple[int, int] | None,
                    once: set[str] = frozenset(), cost: float = 4.0) -> list[PropertyUnit]:
    """Every property in every profile, except those in ``once`` (profile-independent: run in the
    first profile only); then the shard's share, by position in the sorted list."""
    units = []
    for name in sorted(names):
        for p in profiles[:1] if name in once else profiles:
            units.append(PropertyUnit(name, p, PROPERTY_COSTS.get(name, cost)))
    if shard:
        i, n = shard
        units = units[i::n]
    return units
