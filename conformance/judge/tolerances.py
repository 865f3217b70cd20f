"""The tolerance table: bounds per (mode, profile, case recipe, tensor), versioned data.

`conformance/judge/tolerances.json` is written by `gdncheck tolerances derive` (`.derive`) and read
here. A bound is `elem` (the largest scaled elementwise error, `.metrics`) and `nmse` (the largest
NMSE of one call's tensor). Rows are per case recipe (the case id without its `_s{seed}`); an
unknown case gets `global`, a generated layer `ToleranceTable.property_bound`. The shipped table is
pinned (`SHIPPED_SHA256`); a looser one is refused unless `allow_looser=True`, and then every
verdict says so (`ToleranceTable.looser`).

How the bounds are earned and why per recipe: docs/tolerances.md §3, §4, §5a.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from gdncheck.errors import GDNError
from gdncheck.harness import END_TO_END
from gdncheck.profiles import VERIFY_PROFILES
from gdncheck.untrusted import read_json

TABLE_PATH = Path(__file__).with_name("tolerances.json")
TABLE_FORMAT = "gdncheck-tolerances"
#: a table larger than this is refused unread (the packaged one is about 0.3 MB)
MAX_TABLE_BYTES = 64 * 1024 * 1024
#: The rows that judge a layer the property suite generates (end to end only).
PROPERTY_ROWS = "properties"
#: sha256 of the packaged tolerances.json this release ships (re-derived tables update it: it is the
#: one line a review sees change when a bound moves)
SHIPPED_SHA256 = "60dcedc17f122e3a01488a5475b836f95d274dee590f4da9782178d58f868016"
#: how many loosened bounds an error message lists
LISTED_LOOSER = 3


class ToleranceError(GDNError):
    code = "tolerances"


def recipe_of(case_id: str) -> str:
    """``prefill_T100_Hk2_Hv6_dk16_dv8_s0`` -> ``prefill_T100_Hk2_Hv6_dk16_dv8``."""
    return re.sub(r"_s\d+$", "", case_id)


@dataclass(frozen=True)
class Bound:
    tensor: str
    profile: str
    mode: str
    elem: float
    nmse: float
    source: str  # "case <recipe>", "global" or "properties"

    def to_json(self) -> dict:
        return {"elem": self.elem, "nmse": self.nmse, "source": self.source, "profile": self.profile,
                "mode": self.mode}


@dataclass(frozen=True)
class ToleranceTable:
    data: dict
    sha256: str
    source: str
    looser: tuple[str, ...] = ()  # the shipped bounds this table loosens (allowed by name only)

    @property
    def version(self) -> int:
        return int(self.data["version"])

    def bound(self, tensor: str, profile: str, mode: str = END_TO_END, case_id: str | None = None) -> Bound:
        try:
            table = self.data["modes"][mode][profile]
        except KeyError:
            raise ToleranceError(f"the tolerance table {self.source} has no {mode} bounds for profile {profile!r}; "
                                 f"profiles: {', '.join(VERIFY_PROFILES)}") from None
        recipe = recipe_of(case_id) if case_id else None
        row, source = None, "global"
        per_case = table.get("cases", {}).get(recipe, {}) if recipe else {}
        if isinstance(per_case, dict) and tensor in per_case:
            row, source = per_case[tensor], f"case {recipe}"
        elif tensor in table.get("global", {}):
            row = table["global"][tensor]
        if row is None:
            raise ToleranceError(f"the tolerance table {self.source} has no bound for {tensor!r} ({profile}, {mode}); "
                                 f"regenerate it with gdncheck tolerances derive")
        return self._checked(row, tensor, profile, mode, source)

    def property_bound(self, tensor: str, profile: str) -> Bound:
        """The end-to-end bound of a layer the property suite generates: the ``properties`` row (a
        table without one: the global row)."""
        rows = self.data["modes"].get(END_TO_END, {}).get(profile, {}).get(PROPERTY_ROWS, {})
        if not isinstance(rows, dict) or tensor not in rows:
            return self.bound(tensor, profile, END_TO_END, None)
        return self._checked(rows[tensor], tensor, profile, END_TO_END, PROPERTY_ROWS)

    def _checked(self, row, tensor: str, profile: str, mode: str, source: str) -> Bound:
        """The bound a table row holds, refused unless it is {elem, nmse} of finite non-negative numbers."""
        values = [row.get(k) if isinstance(row, dict) else None for k in ("elem", "nmse")]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                   for v in values):
            raise ToleranceError(f"the tolerance table {self.source}: the bound of {tensor!r} ({profile}, {mode}, "
                                 f"{source}) must be {{elem, nmse}} of finite non-negative numbers, found {row!r}")
        return Bound(tensor, profile, mode, float(values[0]), float(values[1]), source)

    def describe(self) -> dict:
        return {"format": TABLE_FORMAT, "version": self.version, "sha256": self.sha256, "path": self.source,
                "derivation": self.data.get("derivation", {}), "shipped_sha256": SHIPPED_SHA256,
                "shipped": self.sha256 == SHIPPED_SHA256, "looser_bounds": len(self.looser)}

    def lookups(self) -> set[tuple[str, str, str | None, str, bool]]:
        """Every lookup a row of this table answers: ``(mode, profile, recipe or None, tensor, property)``."""
        out = set()
        for mode, profiles in self.data["modes"].items():
            for profile, sections in profiles.items():
                out.update((mode, profile, None, t, False) for t in sections.get("global", {}))
                out.update((mode, profile, None, t, True) for t in sections.get(PROPERTY_ROWS, {})
                           if mode == END_TO_END)
                out.update((mode, profile, recipe, t, False) for recipe, r in sections.get("cases", {}).items()
                           if isinstance(r, dict) for t in r)
        return out

    def _lookup(self, mode: str, profile: str, recipe: str | None, tensor: str, prop: bool) -> Bound:
        if prop:
            return self.property_bound(tensor, profile)
        return self.bound(tensor, profile, mode, f"{recipe}_s0" if recipe else None)

    def loosened(self, shipped: ToleranceTable) -> tuple[str, ...]:
        """Every bound this table applies looser than the one ``shipped`` applies to the same lookup, over
        the rows of both: a row the shipped table lacks is compared with the bound the shipped table
        would use there, and a shipped row this table lacks with the bound this one falls back to (its
        global row): deleting rows loosens as surely as raising them. A bound the shipped table has and
        this one has nowhere (not even in its global row) is :class:`ToleranceError`, one line."""
        out = []
        for mode, profile, recipe, tensor, prop in sorted(self.lookups() | shipped.lookups(),
                                                          key=lambda k: (k[0], k[1], k[2] or "", k[3], k[4])):
            try:
                theirs = shipped._lookup(mode, profile, recipe, tensor, prop)
            except ToleranceError:
                continue  # a tensor the shipped table never judges
            try:
                mine = self._lookup(mode, profile, recipe, tensor, prop)
            except ToleranceError:
                where = f"{mode}, {profile}" + (f", case {recipe}" if recipe else ", properties" if prop else "")
                raise ToleranceError(f"tolerance table {self.source} has no bound for {tensor!r} ({where}), which the "
                                     f"shipped table bounds: expected every bound of the shipped one (regenerate it "
                                     f"with gdncheck tolerances derive)") from None
            if mine.elem > theirs.elem or mine.nmse > theirs.nmse:
                where = f"{mode} {profile} {recipe or (PROPERTY_ROWS if prop else 'global')} {tensor}"
                fallback = f" (its {mine.source} row: the shipped row is missing)" if mine.source != theirs.source \
                    and theirs.source != "global" else ""
                out.append(f"{where}: elem {mine.elem:.3g} / nmse {mine.nmse:.3g}{fallback} > shipped "
                           f"{theirs.elem:.3g} / {theirs.nmse:.3g}")
        return tuple(out)


@lru_cache(maxsize=4)
def _load(path: str) -> ToleranceTable:
    data, raw = read_json(path, what="tolerance table", error=ToleranceError, max_bytes=MAX_TABLE_BYTES,
                          with_raw=True)
    if not isinstance(data, dict) or data.get("format") != TABLE_FORMAT or "modes" not in data:
        raise ToleranceError(f"{path}: expected a JSON table of format {TABLE_FORMAT!r}")
    version, modes = data.get("version"), data["modes"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise ToleranceError(f"{path}: expected 'version' an integer, found {version!r}")
    if not isinstance(modes, dict) or not all(isinstance(m, dict) and all(
            isinstance(p, dict) and isinstance(p.get("global", {}), dict) and isinstance(p.get("cases", {}), dict)
            and isinstance(p.get(PROPERTY_ROWS, {}), dict) for p in m.values()) for m in modes.values()):
        raise ToleranceError(f"{path}: expected 'modes' as {{mode: {{profile: {{global, cases[, properties]}}}}}} "
                             "objects")
    return ToleranceTable(data, hashlib.sha256(raw).hexdigest(), str(path))


def load_table(path: str | Path | None = None, *, allow_looser: bool = False) -> ToleranceTable:
    """The packaged table (pinned: :data:`SHIPPED_SHA256`) or the one at ``path``, refused when it loosens
    a shipped bound unless ``allow_looser`` (module docstring)."""
    shipped = _load(str(TABLE_PATH))
    if shipped.sha256 != SHIPPED_SHA256:
        raise ToleranceError(f"the packaged tolerance table {TABLE_PATH} has sha256 {shipped.sha256}, expected "
                             f"{SHIPPED_SHA256} (the one this release ships): it was changed; reinstall gdncheck, or "
                             "name a table with --tolerances (one that loosens a shipped bound also needs "
                             "--allow-looser-tolerances)")
    if not path or Path(path).resolve() == TABLE_PATH.resolve():
        return shipped
    table = _load(str(Path(path)))
    looser = table.loosened(shipped)
    if looser and not allow_looser:
        shown = "; ".join(looser[:LISTED_LOOSER]) + (f"; and {len(looser) - LISTED_LOOSER} more"
                                                     if len(looser) > LISTED_LOOSER else "")
        raise ToleranceError(f"tolerance table {path} loosens {len(looser)} bound(s) of the shipped one ({shown}): "
                             "pass --allow-looser-tolerances to judge with it anyway (every verdict will say so)")
    return ToleranceTable(table.data, table.sha256, table.source, looser)
