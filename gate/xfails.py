"""Known failures (xfails): cases that an implementation is known to fail, each with its reason.

A plain-text file, one entry a line (``gate/xfails.txt`` is the packaged default)::

    IMPL  PROFILE  CASE  TENSORS  # reason
    triton  f32  wide-d1024_T4_Hk1_Hv2_dk16_dv16  core_gated,attn_out  # why, and where it is tracked

``IMPL`` is the ``--impl`` spec or ``*``; ``PROFILE`` a profile or ``*``; ``CASE`` a case id or id
prefix; ``TENSORS`` the only tensors allowed to fail (comma-separated, or ``*``). A failing case
whose failing tensors are all covered by an entry is reported as *known failure* with the reason
and does not fail the gate; anything else it fails still does. An entry that matches no failure of
a case that ran is *stale* (the case passes now): the gate warns, so the file cannot rot silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gdncheck.errors import GDNError
from gdncheck.untrusted import UnsafePathError, read_bounded

DEFAULT_PATH = Path(__file__).with_name("xfails.txt")
#: a known-failures file larger than this is refused unread
MAX_XFAILS_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class XFail:
    impl: str
    profile: str
    case: str
    tensors: tuple[str, ...]  # ("*",) for any
    reason: str
    line: int

    def applies(self, impl: str, profile: str, case: str) -> bool:
        return self.impl in ("*", impl) and self.profile in ("*", profile) and case.startswith(self.case)

    def covers(self, tensors: set[str]) -> bool:
        return self.tensors == ("*",) or tensors <= set(self.tensors)

    def to_json(self) -> dict:
        return {"impl": self.impl, "profile": self.profile, "case": self.case, "tensors": list(self.tensors),
                "reason": self.reason, "line": self.line}


def load_xfails(path: str | Path | None = None) -> list[XFail]:
    path = Path(path) if path else DEFAULT_PATH
    try:
        text = read_bounded(path, MAX_XFAILS_BYTES, "known-failures file").decode("utf-8")
    except UnsafePathError as exc:
        raise GDNError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise GDNError(f"cannot read the known-failures file {path}: {exc}") from None
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        body, _, reason = raw.partition("#")
        fields = body.split()
        if not fields:
            continue
        if len(fields) != 4:
            raise GDNError(f"{path}:{n}: expected 'IMPL PROFILE CASE TENSORS  # reason', found {raw.strip()!r}")
        if not reason.strip():
            raise GDNError(f"{path}:{n}: a known failure needs its reason after '#'")
        out.append(XFail(fields[0], fields[1], fields[2], tuple(fields[3].split(",")), reason.strip(), n))
    return out


def classify(xfails: list[XFail], impl: str, profile: str, case_reports) -> tuple[dict[str, XFail], list[XFail]]:
    """(case id -> the entry that covers its failure, stale entries: those of a case that passed)."""
    covered: dict[str, XFail] = {}
    used: set[XFail] = set()
    ran: set[XFail] = set()
    for c in case_reports:
        for x in xfails:
            if not x.applies(impl, profile, c.id):
                continue
            if c.status != "fail":
                if c.status == "pass":
                    ran.add(x)
                continue
            failing = {r.tensor for r in c.records if r.verdict == "fail"}
            if failing and x.covers(failing):
                covered[c.id] = x
                used.add(x)
    return covered, sorted(ran - used, key=lambda x: x.line)  # an entry is stale when its case passes
