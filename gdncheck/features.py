"""The fixture format's features and versions (fixtures/FORMAT.md §2, §10, Changelog).

A *feature* is a part of the format a runner must read to run a case as written: a program step, or a
field with meaning of a step or of the config. Each was added in one version of the format
(:data:`FEATURES`: ``since``); the manifest's version is ``"1.N"``, its minor number grown with each
field with meaning added (:data:`FORMAT_VERSION`); a manifest written before minors existed says the
integer ``1``. Each case names the features it needs, with the first step that needs each
(``requires``, computed here from the program and the config: :func:`case_requires`, never written by
hand), so a runner that does not implement one declares the case not applicable from that step
(:func:`not_applicable_reason`: ``requires commit_snapshots (format 1.2)``) instead of ignoring a field
and computing something else.

The core of the format (``construct``, ``forward``, ``decode``, ``reset``, ``snapshot``, ``restore``,
the dense layer, the expected errors) is no feature: every runner reads it. What a case *exercises*
among things a port may lack (a per-head norm, the seq-len reset, ...) is its ``coverage`` (fixtures
coverage), a separate list; every feature here implies a coverage feature (:data:`COVERAGE_OF`), so a
case declared not applicable for a feature it requires is allowed by the coverage rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gdncheck.errors import GDNError


@dataclass(frozen=True)
class Feature:
    since: str  # the format version that added it, "1.N"
    what: str  # what a runner must implement to run a case that requires it


#: The version of the fixture format this gdncheck writes and reads to the end (a manifest's
#: ``format_version``). An older ``1.N`` and the integer ``1`` are read too; a newer ``1.N`` is read
#: case by case (a case requiring a feature this gdncheck does not know is unusable); another major is refused.
FORMAT_VERSION = "1.3"
MAJOR = 1

#: Every feature, in the order the format added them (the Changelog of fixtures/FORMAT.md lists them).
FEATURES: dict[str, Feature] = {
    "snapshot_files": Feature("1.0", "save and load steps: snapshot files written to and read from the outputs "
                                     "folder (FORMAT.md §4, §7)"),
    "strict_mode": Feature("1.0", "construct's strict: true: raise seq_pos_mismatch instead of the seq-len reset "
                                  "(FORMAT.md §4)"),
    "moe": Feature("1.0", "a sparse layer: a config with num_experts, the router, experts and shared expert weights "
                          "and their stage tensors (FORMAT.md §5, docs/moe.md)"),
    "packed_calls": Feature("1.0", "a pool of state slots (construct's pool_size) and packed calls over it: "
                                   "forward_packed, free (FORMAT.md §4.1)"),
    "spec_decode": Feature("1.0", "speculative verify and its commit: verify_spec, commit with of_call and accepted "
                                  "(FORMAT.md §4.1)"),
    "prefix_snapshots": Feature("1.0", "a packed call writing prefix states to other slots: the prefix_snapshots "
                                       "step (FORMAT.md §4.1)"),
    "mixed_batches": Feature("1.1", "verify rows beside plain rows in one packed call: the forward_mixed step, "
                                    "commit's verify flags (FORMAT.md §4.1)"),
    "commit_snapshots": Feature("1.2", "a commit keeping states inside or at the end of its accepted windows in other "
                                       "slots: commit's snap_seq, snap_offset, snap_slot (FORMAT.md §4.1)"),
    "sharded": Feature("1.3", "a layer split across ranks: the shard step's tensor-parallel plan (each rank its heads, "
                              "writing its share and its out_proj partial), context-parallel plan (each rank its "
                              "tokens, the conv halo and the state summaries exchanged) or both at once (tpcp), one "
                              "outputs file a rank "
                              "(FORMAT.md §4.2, per-rank layout §7.1; docs/sharding.md)"),
}

#: Per program op: the features the op itself needs.
OP_FEATURES: dict[str, tuple[str, ...]] = {
    "construct": (), "reset": (), "forward": (), "decode": (), "snapshot": (), "restore": (),
    "save": ("snapshot_files",), "load": ("snapshot_files",),
    "forward_packed": ("packed_calls",), "free": ("packed_calls",),
    "verify_spec": ("packed_calls", "spec_decode"), "commit": ("packed_calls", "spec_decode"),
    "prefix_snapshots": ("packed_calls", "prefix_snapshots"),
    "forward_mixed": ("packed_calls", "spec_decode", "mixed_batches"),
    "shard": ("sharded",),
}
_CALL = ("call", "T", "seq_pos", "tokens", "seq_len_after", "expected")
_PACKED = (*_CALL, "cu_seqlens", "slots", "requests")
_SNAPS = ("snap_seq", "snap_offset", "snap_slot")
#: Per program op: every field the format defines for it (``op`` aside), with the features a field needs
#: beyond its op's. A step carrying another field is of a newer format (a reader refuses to run it).
OP_FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    "construct": {"strict": (), "pool_size": ("packed_calls",)},
    "reset": {},
    "forward": dict.fromkeys(_CALL, ()),
    "decode": dict.fromkeys(_CALL, ()),
    "snapshot": {"slot": (), "state_of_call": ()},
    "restore": {"slot": ()},
    "save": {"slot": (), "file": (), "state_of_call": ()},
    "load": {"slot": (), "file": ()},
    "forward_packed": dict.fromkeys(_PACKED, ()),
    "verify_spec": dict.fromkeys(_PACKED, ()),
    "prefix_snapshots": dict.fromkeys((*_PACKED, *_SNAPS), ()),
    "forward_mixed": {**dict.fromkeys(_PACKED, ()), "verify": ()},
    "commit": {**dict.fromkeys(("call", "of_call", "accepted", "seq_pos", "slots", "T", "seq_len_after", "expected"),
                               ()),
               "verify": ("mixed_batches",), **dict.fromkeys(_SNAPS, ("commit_snapshots",))},
    "free": {"slots": ()},
    "shard": {"tp": (), "cp": (), "tpcp": (), "call": ()},
}
#: feature -> the coverage feature (fixtures/coverage.py) that lets a port lacking it declare a case not
#: applicable: a feature with none would keep its cases required (the coverage rule, docs/bad-inputs.md).
COVERAGE_OF: dict[str, str] = {
    "snapshot_files": "snapshot_files", "strict_mode": "strict_mode", "moe": "moe", "packed_calls": "packed_calls",
    "spec_decode": "spec_decode", "prefix_snapshots": "prefix_snapshots", "mixed_batches": "mixed_batches",
    "commit_snapshots": "prefix_snapshots", "sharded": "sharded",
}

_VERSION = re.compile(r"([0-9]{1,4})\.([0-9]{1,4})")


class FeatureError(GDNError):
    """A port's declared ``features`` that name no feature of the format."""

    code = "features"


class FormatVersionError(FeatureError):
    """A format version that is no version, or of a major this gdncheck does not read."""

    code = "format_version"


def parse_version(value: Any, what: str = "format_version") -> tuple[int, int]:
    """``(major, minor)`` of a version: the string ``"1.N"``, or the integer ``1`` of manifests written
    before minor versions existed (``"1"`` in an outputs file's string metadata), read as ``(1, 0)``: the
    format as the 57-case suite stated it.
    Anything else is a :class:`FormatVersionError` naming what was found."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10_000:
        return (value, 0)  # a major alone: the integer 1 of manifests before minors (2: another major)
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,4}", value):
        return (int(value), 0)
    m = _VERSION.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise FormatVersionError(f"expected {what} a version \"MAJOR.MINOR\" (this gdncheck writes "
                                 f"\"{FORMAT_VERSION}\"; the integer 1 of older manifests is read too), found "
                                 f"{value!r:.80}")
    return (int(m.group(1)), int(m.group(2)))


def version_text(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def check_readable(value: Any, what: str = "format_version") -> tuple[int, int]:
    """The version of a manifest this gdncheck reads: major 1, any minor (a newer minor is read case by
    case: :func:`requires_problem`). Another major is refused, saying so."""
    version = parse_version(value, what)
    if version[0] != MAJOR:
        raise FormatVersionError(f"expected {what} of major version {MAJOR} (this gdncheck reads fixture format "
                                 f"{MAJOR}.x up to {FORMAT_VERSION}), found {value!r:.40}: a suite of another major "
                                 f"version; use the gdncheck that built it")
    return version


def step_requires(step: Mapping[str, Any]) -> list[str]:
    """The features one step needs: its op's, its fields', and ``strict_mode`` for a strict construct.
    An op or field this version does not define needs nothing here (the reader refuses it first:
    :func:`unknown_fields`)."""
    op = step.get("op")
    if not isinstance(op, str):
        return []
    out = list(OP_FEATURES.get(op, ()))
    for name in step:
        for f in OP_FIELDS.get(op, {}).get(name, ()):
            if f not in out:
                out.append(f)
    if op == "construct" and step.get("strict") is True:
        out.append("strict_mode")
    return out


def case_requires(config: Any, program: Any) -> dict[str, int]:
    """``requires`` of a case: each feature its program and config need, with the first step that needs
    it (the step from which a runner without it declares the case not applicable), in the order of
    :data:`FEATURES`. A sparse config (``num_experts``) needs ``moe`` from its ``construct``."""
    first: dict[str, int] = {}
    steps = program if isinstance(program, list) else []
    for i, step in enumerate(steps):
        if not isinstance(step, Mapping):
            continue
        needs = step_requires(step)
        if step.get("op") == "construct" and isinstance(config, Mapping) and config.get("num_experts"):
            needs.append("moe")
        for f in needs:
            first.setdefault(f, i)
    return {f: first[f] for f in FEATURES if f in first}


def requires_of(entry: Mapping[str, Any]) -> dict[str, int]:
    """A manifest entry's ``requires`` as written (validated by the manifest reader), else (a manifest
    written before the field existed) computed from its program and config."""
    req = entry.get("requires")
    if isinstance(req, Mapping):
        return dict(req)
    return case_requires(entry.get("config"), entry.get("program"))


def unknown_fields(program: Any) -> str | None:
    """The first step of ``program`` whose op or a field of it this version of the format does not
    define (a newer suite, or a typo: running it would ignore what it asks), said in one line; None."""
    for i, step in enumerate(program if isinstance(program, list) else []):
        if not isinstance(step, Mapping):
            continue
        op = step.get("op")
        if not isinstance(op, str) or op not in OP_FIELDS:
            return f"step {i} is op {str(op)!r:.60}, which fixture format {FORMAT_VERSION} does not define"
        extra = sorted(str(k) for k in step if k != "op" and k not in OP_FIELDS[op])
        if extra:
            return (f"step {i} ({op}) carries field(s) {', '.join(repr(e[:60]) for e in extra[:4])}, which fixture "
                    f"format {FORMAT_VERSION} does not define for {op}")
    return None


def table() -> dict[str, dict[str, str]]:
    """The manifest's ``features`` table: every feature of this version, ``{since, what}``."""
    return {name: {"since": f.since, "what": f.what} for name, f in FEATURES.items()}


def requires_problem(entry: Mapping[str, Any], manifest_features: Mapping[str, Any] | None,
                     gdncheck_version: str) -> str | None:
    """Why a manifest entry's ``requires`` cannot be trusted, in one line, or None: a feature this
    gdncheck does not know (a suite newer than it: the case cannot be run or judged as written), a
    step or field it does not define, or a ``requires`` other than the one its program and config need
    (a hand edit that hides a feature from runners)."""
    req = entry.get("requires")
    table_ = manifest_features if isinstance(manifest_features, Mapping) else {}
    if isinstance(req, Mapping):
        unknown = [f for f in req if f not in FEATURES]
        if unknown:
            f = unknown[0]
            since = table_.get(f, {}).get("since") if isinstance(table_.get(f), Mapping) else None
            where = (f" (format {since:.20}, by the manifest's features table)" if isinstance(since, str)
                     else " (not in the manifest's features table either)")
            return (f"requires feature {f!r:.60}{where}, which gdncheck {gdncheck_version} does not know: it reads "
                    f"fixture format up to {FORMAT_VERSION}, and this suite is newer; upgrade gdncheck to run or "
                    f"judge this case")
        missing = [f for f in req if f not in table_]
        if table_ and missing:
            return f"requires {missing[0]!r}, which the manifest's features table does not list"
    field = unknown_fields(entry.get("program"))
    if field is not None:
        return f"{field} (a newer suite names such a field's feature in requires); gdncheck cannot run it as written"
    if isinstance(req, Mapping):
        want = case_requires(entry.get("config"), entry.get("program"))
        if dict(req) != want:
            return (f"requires {_fmt(req)}, but its program and config need {_fmt(want)} (requires is computed from "
                    f"the program by the builder, FORMAT.md §2)")
    return None


def table_problem(manifest_features: Any) -> str | None:
    """A manifest ``features`` table that contradicts this gdncheck's (a known feature of another version)."""
    if not isinstance(manifest_features, Mapping):
        return None
    for name, row in manifest_features.items():
        if name in FEATURES and isinstance(row, Mapping) and row.get("since") != FEATURES[name].since:
            return (f"features.{name}.since is {row.get('since')!r:.20}, but fixture format {FORMAT_VERSION} added "
                    f"{name} in {FEATURES[name].since}")
    return None


def _fmt(req: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: step {v}" for k, v in req.items()) + "}" if req else "nothing"


def since_of(feature: str, manifest_features: Mapping[str, Any] | None = None) -> str | None:
    """The version that added ``feature``: this gdncheck's, else the manifest's table's."""
    if feature in FEATURES:
        return FEATURES[feature].since
    row = (manifest_features or {}).get(feature)
    since = row.get("since") if isinstance(row, Mapping) else None
    return since if isinstance(since, str) else None


def not_applicable_reason(missing: Iterable[str], manifest_features: Mapping[str, Any] | None = None) -> str:
    """The reason a runner gives for a case requiring features it does not implement, in the format's
    words: ``requires commit_snapshots (format 1.2)``; several: ``requires mixed_batches (format 1.1),
    commit_snapshots (format 1.2)``."""
    parts = []
    for f in missing:
        since = since_of(f, manifest_features)
        parts.append(f"{f} (format {since})" if since else f)
    return "requires " + ", ".join(parts)


def check_declared(features: Any, who: str) -> frozenset[str]:
    """A port's declared ``features`` (a collection of feature names), refused when it is no such collection
    or names a feature the format does not have (a typo would declare every case not applicable)."""
    if isinstance(features, str | bytes) or not isinstance(features, Iterable):
        raise FeatureError(f"expected {who}.features a collection of feature names ({', '.join(FEATURES)}), "
                                 f"found {type(features).__name__}")
    names = list(features)
    bad = [f for f in names if f not in FEATURES]
    if bad:
        raise FeatureError(f"expected {who}.features to name features of fixture format {FORMAT_VERSION} "
                                 f"({', '.join(FEATURES)}), found {str(bad[0])!r:.60}")
    return frozenset(names)


def features_up_to(version: Any) -> frozenset[str]:
    """The features of the format up to ``version`` ("1.N" or 1): what a runner written for it reads."""
    v = parse_version(version)
    return frozenset(f for f, feat in FEATURES.items() if parse_version(feat.since) <= v)


def added_since(written_for: Any, requires: Mapping[str, Any] | Iterable[str],
                manifest_features: Mapping[str, Any] | None = None) -> list[tuple[str, str]]:
    """The features among ``requires`` added after version ``written_for`` (a port's outputs metadata
    ``fixture_format_version``), each with its version; [] when none or ``written_for`` is unreadable."""
    try:
        v = parse_version(written_for)
    except FormatVersionError:
        return []
    out = []
    for f in requires:
        since = since_of(f, manifest_features)
        try:
            if since is not None and parse_version(since) > v:
                out.append((f, since))
        except FormatVersionError:
            continue
    return out


def since_note(written_for: Any, requires: Mapping[str, Any] | Iterable[str],
               manifest_features: Mapping[str, Any] | None = None) -> str | None:
    """One sentence for a failure or a not-applicable case of a port written for an older format: the
    features the case requires that were added since (None when there are none)."""
    newer = added_since(written_for, requires, manifest_features)
    if not newer:
        return None
    return (f"the port says it was written for fixture format {written_for}, and this case requires "
            f"{', '.join(f'{f} (format {s})' for f, s in newer)}, added since (FORMAT.md, Changelog): implement "
            f"{'it' if len(newer) == 1 else 'them'}, or declare the case not applicable from the step that needs "
            f"{'it' if len(newer) == 1 else 'them'}")
