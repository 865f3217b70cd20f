"""The tolerance table: bounds per (mode, profile, case recipe, tensor), versioned data.

``conformance/judge/tolerances.json`` is written by ``gdncheck tolerances derive`` (:mod:`.derive`) and
read here. A bound has two parts, both earned from data (docs/tolerances.md):

- ``elem``: the largest scaled elementwise error (:mod:`.metrics`) allowed anywhere in the tensor;
- ``nmse``: the largest NMSE allowed for the tensor of one call.

Bounds are kept per case *recipe* (the case id without its ``_s{seed}``): how far a correct
low-precision port strays depends on the case's conditioning (a decayed state read by a nearly
orthogonal query, saturated gates, a long memory) far more than on anything else, so each case gets
the envelope earned by its own recipe at other seeds. A case the table does not know (a fixture
built from a checkpoint, the full suite) gets the ``global`` bound: the envelope over every recipe.
A layer the property suite generates gets the ``properties`` bound (:meth:`ToleranceTable.property_bound`):
the envelope over every recipe and over a stratified sample of the properties' own draws, which
visit edges no checkpoint has (docs/tolerances.md §3).
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
from gdncheck.untrusted import UnsafePathError, loads_untrusted, read_bounded

TABLE_PATH = Path(__file__).with_name("tolerances.json")
TABLE_FORMAT = "gdncheck-tolerances"
#: a table larger than this is refused unread (the packaged one is about 0.3 MB)
MAX_TABLE_BYTES = 64 * 1024 * 1024
#: The rows that judge a layer the property suite generates (end to end only).
PROPERTY_ROWS = "properties"


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
                "derivation": self.data.get("derivation", {})}


@lru_cache(maxsize=4)
def _load(path: str) -> ToleranceTable:
    try:
        raw = read_bounded(path, MAX_TABLE_BYTES, "tolerance table")
        data = loads_untrusted(raw)
    except FileNotFoundError:
        raise ToleranceError(f"expected a tolerance table at {path}, found none") from None
    except UnsafePathError as exc:
        raise ToleranceError(str(exc)) from None
    except RecursionError:
        raise ToleranceError(f"{path}: not a usable tolerance table (JSON nested too deep)") from None
    except (OSError, ValueError) as exc:
        raise ToleranceError(f"{path}: not a readable tolerance table ({exc})") from None
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


def load_table(path: str | Path | None = None) -> ToleranceTable:
    return _load(str(Path(path) if path else TABLE_PATH))
