"""Known failures (xfails): cases an implementation is known to fail, each with its reason. One
format for `gdncheck verify --xfails`, `gdncheck gate --xfails` and `pytest --gdncheck-xfails`.

A plain-text file, one entry a line, `#` starting the reason (a line of only a comment is one)::

    IMPL  PROFILE  CASE  WHAT  # reason
    triton   f32  wide-d1024_T4_Hk1_Hv2_dk16_dv16  core_gated,attn_out  # why, and where it is tracked
    myport:factory  *  decode_  delta_rule  # a stage: any of its tensors may fail

A failing case whose every failing tensor is covered by an applicable entry is a known failure; one
failing beyond it still fails, and so does a case that broke the coverage rule (declared not
applicable though every port must run it, judged no tensor: :data:`COVERAGE_REASONS`), which no
entry excuses. An entry that covers no failure of a passing case is *stale*; what that does is the
caller's (verify and the gate warn, the pytest plugin fails it). An entry that speaks of no case of
a run (a typo in CASE, another PROFILE or IMPL) is listed (:func:`unmatched`). A byte-order mark is
ignored; ``*`` as CASE and a second entry for one IMPL, PROFILE and CASE are refused.

Each field and the verdicts: docs/verify.md, "Known failures"; docs/plugins.md for pytest.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gdncheck.errors import GDNError
from gdncheck.profiles import VERIFY_PROFILES
from gdncheck.stages import (
    MOE_STAGE_NAMES,
    STAGE_NAMES,
    STATE_STAGE,
    TENSOR_ORDER,
    moe_layer_tensor_names,
)
from gdncheck.untrusted import UnsafePathError, one_line, read_bounded

#: a known-failures file larger than this is refused unread
MAX_XFAILS_BYTES = 4 * 1024 * 1024
#: the group name of saved snapshot files (records of a ``save`` step)
SNAPSHOT = "snapshot"
#: every name WHAT may hold (besides ``*``)
NAMES = frozenset((*TENSOR_ORDER, *moe_layer_tensor_names(), "seq_len", *STAGE_NAMES, *MOE_STAGE_NAMES,
                   STATE_STAGE, SNAPSHOT))
FORMAT = "IMPL PROFILE CASE WHAT  # reason"


@dataclass(frozen=True)
class XFail:
    impl: str
    profile: str
    case: str
    tensors: tuple[str, ...]  # tensor and stage names; ("*",) for any failure
    reason: str
    line: int
    file: str = ""

    def applies(self, impl: str | Iterable[str], profile: str, case: str) -> bool:
        """Whether the entry speaks of this case: ``impl`` one name or several (the spec, the name)."""
        names = {impl} if isinstance(impl, str) else set(impl)
        return (self.impl == "*" or self.impl in names) and self.profile in ("*", profile) \
            and case.startswith(self.case)

    def covers_case(self, report) -> bool:
        """Whether the entry covers the failure of this failing case: every failing record named by
        its tensor, its stage (``state`` for ``seq_len``) or, for a saved snapshot, ``snapshot``."""
        if self.tensors == ("*",):
            return True
        allowed = set(self.tensors)
        failing = [r for r in report.records if r.verdict == "fail"]
        return bool(failing) and all(allowed & _names_of(r) for r in failing)

    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.file else f"line {self.line}"

    def to_json(self) -> dict:
        return {"impl": self.impl, "profile": self.profile, "case": self.case, "tensors": list(self.tensors),
                "reason": self.reason, "line": self.line}


def _names_of(record) -> set[str]:
    names = {record.tensor, getattr(record, "stage", None) or STATE_STAGE}
    if getattr(record, "op", None) == "save":
        names.add(SNAPSHOT)
    return names


def load_xfails(path: str | Path) -> list[XFail]:
    """The entries of a known-failures file; a :class:`GDNError` naming the file and line for one
    that cannot be read or is malformed (four fields, a reason, a known profile and names)."""
    path = Path(path)
    try:  # utf-8-sig: a byte-order mark (an editor's) is no part of the first entry's IMPL
        text = read_bounded(path, MAX_XFAILS_BYTES, "known-failures file").decode("utf-8-sig")
    except UnsafePathError as exc:
        raise GDNError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise GDNError(f"cannot read the known-failures file {path}: {exc}") from None
    out = []
    seen: dict[tuple[str, str, str], int] = {}  # (impl, profile, case) -> its line
    for n, raw in enumerate(text.splitlines(), 1):
        body, _, reason = raw.partition("#")
        fields = body.split()
        if not fields:
            continue
        where = f"{one_line(path)}:{n}"
        if len(fields) != 4:
            raise GDNError(f"{where}: expected '{FORMAT}', found {one_line(raw.strip())!r}")
        if not reason.strip():
            raise GDNError(f"{where}: a known failure needs its reason after '#'")
        impl, profile, case, what = fields
        if "*" in case:
            raise GDNError(f"{where}: expected CASE a case id or id prefix, found {one_line(case)!r}: a known "
                           f"failure names its cases ('*' is no wildcard there, and would match no case)")
        if (impl, profile, case) in seen:
            raise GDNError(f"{where}: a second entry for {one_line(impl)} {profile} {one_line(case)} (the first is "
                           f"line {seen[impl, profile, case]}); expected one entry per implementation, profile and "
                           "case: merge their WHAT")
        seen[impl, profile, case] = n
        if profile != "*" and profile not in VERIFY_PROFILES:
            raise GDNError(f"{where}: expected PROFILE '*' or one of {', '.join(VERIFY_PROFILES)}, found "
                           f"{one_line(profile)!r}")
        names = tuple(what.split(","))
        unknown = [x for x in names if x not in NAMES] if names != ("*",) else []
        if unknown:
            raise GDNError(f"{where}: expected WHAT '*' or tensor and stage names (gdncheck/stages.py, 'state', "
                           f"'snapshot'), found {', '.join(one_line(u)[:60] for u in unknown)!r}")
        out.append(XFail(impl, profile, case, names, one_line(reason.strip()), n, str(path)))
    return out


#: the first-divergence reasons of a case that broke the coverage rule (fixtures/FORMAT.md §2): a
#: case every port must run declared not applicable, a case that judged no tensor. No known failure
#: covers them: a known failure explains a failure, it never stands in for a verdict not reached.
COVERAGE_REASONS = {"not_applicable": "it declared not applicable a case every port must run",
                    "nothing_judged": "it judged no tensor"}


class Tally:
    """The entries of one profile's run, told each case as it is judged: which entry covers a
    failing case (:meth:`see`), and at the end which entries are stale (:meth:`stale`), which could
    not excuse a broken coverage rule (``refused``) and which matched no case (:func:`unmatched`)."""

    def __init__(self, xfails: Iterable[XFail], profile: str):
        self.xfails = list(xfails)
        self.profile = profile
        self.known: dict[str, XFail] = {}  # case id -> the entry that covers its failure
        self.refused: dict[str, tuple[XFail, str]] = {}  # case id -> (the entry, why it cannot cover it)
        self.applied: set[XFail] = set()  # the entries that spoke of some case of the run
        self.impl_names: set[str] = set()  # every name the run's implementation goes by
        self._used: set[XFail] = set()
        self._passed: set[XFail] = set()

    def see(self, report, impl: str | Iterable[str]) -> XFail | None:
        """The entry that covers this case's failure (None: it passed, or fails beyond every entry, or
        broke the coverage rule: :data:`COVERAGE_REASONS`)."""
        names = [impl] if isinstance(impl, str) else list(impl)
        self.impl_names.update(names)
        divergence = getattr(report, "first_divergence", None)
        coverage = COVERAGE_REASONS.get(getattr(divergence, "reason", None))
        for x in self.xfails:
            if not x.applies(names, self.profile, report.id):
                continue
            self.applied.add(x)
            if report.status == "pass":
                self._passed.add(x)
            elif report.status == "fail" and report.id not in self.known and x.covers_case(report):
                if coverage is not None:
                    self.refused.setdefault(report.id, (x, coverage))
                    continue
                self.known[report.id] = x
                self._used.add(x)
        return self.known.get(report.id)

    def stale(self) -> list[XFail]:
        """The entries of a case that passed and that covered no failure, in file order."""
        return sorted(self._passed - self._used, key=lambda x: (x.file, x.line))


def unmatched(xfails: Iterable[XFail], applied: set[XFail], *, profiles: Iterable[str], impl_names: set[str],
              suite_ids: Iterable[str] | None) -> list[tuple[XFail, str]]:
    """The entries that spoke of no case of a run, each with why where the run shows it (a CASE no
    case id of the suite starts with, another PROFILE, another IMPL), in file order. An entry whose
    cases were only not selected is no finding (another run judges them) and is left out."""
    profiles, ids = list(profiles), list(suite_ids) if suite_ids is not None else None
    out = []
    for x in sorted(set(xfails) - applied, key=lambda x: (x.file, x.line)):
        if ids is not None and not any(i.startswith(x.case) for i in ids):
            out.append((x, f"no case of the suite starts with {x.case!r}"))
        elif x.profile != "*" and x.profile not in profiles:
            out.append((x, f"profile {x.profile}; this run's: {', '.join(profiles)}"))
        elif x.impl != "*" and impl_names and x.impl not in impl_names:
            out.append((x, f"implementation {x.impl!r}; this run's: {', '.join(sorted(impl_names))}"))
    return out


def unmatched_line(found: list[tuple[XFail, str]]) -> str:
    """The warning that lists them: ``known-failure entries that match no case of this run: ...``."""
    return (f"{len(found)} known-failure entry(ies) match no case of this run (a typo, another profile or "
            "implementation?): " + "; ".join(f"{one_line(x.where())} ({one_line(why)})" for x, why in found))


def classify(xfails: list[XFail], impl: str | Iterable[str], profile: str,
             case_reports) -> tuple[dict[str, XFail], list[XFail]]:
    """(case id -> the entry that covers its failure, stale entries: those of a case that passed)."""
    tally = Tally(xfails, profile)
    for c in case_reports:
        tally.see(c, impl)
    return tally.known, tally.stale()


def failing_names(report) -> list[str]:
    """The tensors a failing case fails in, in the order of its records (for the reports)."""
    return sorted({r.tensor for r in report.records if r.verdict == "fail"})
