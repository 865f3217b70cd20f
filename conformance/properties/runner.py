"""Running the property suite without pytest: what ``gdncheck gate`` calls, and the command line
``python -m gdncheck.conformance.properties``.

Each property becomes a Hypothesis test (``@given(data=st.data())``) under the chosen profile
(``dev``, ``ci``, ``nightly``: :mod:`gdncheck.conformance.properties.hypothesis_profiles`) and ``max_examples``.
A failure is reported with Hypothesis' falsifying example (every draw by its label), the blob that
replays it, and a one-line command that does::

    GDN_IMPL=triton GDN_PROFILE=bf16 python -m gdncheck.conformance.properties -k split_invariance \\
        --hypothesis-profile ci --replay 'AXicY2BgYAQ...'
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field

from hypothesis import HealthCheck, Phase, given, reproduce_failure, settings
from hypothesis import __version__ as hyp_version
from hypothesis import strategies as st

from gdncheck.env import limit_blas_threads
from gdncheck.errors import GDNError
from gdncheck.untrusted import OneLineParser

from .hypothesis_profiles import register_profiles
from .registry import PROPERTIES, PropertySkip, Subject, subject_from_env

BLOB = re.compile(r"@reproduce_failure\(\s*'([^']+)'\s*,\s*b'([^']*)'\s*\)")


@dataclass
class PropertyResult:
    name: str
    chapter: str
    implementation: str
    profile: str
    status: str  # pass | fail | skip
    seconds: float
    examples: int
    message: str = ""
    notes: list[str] = field(default_factory=list)  # the falsifying example, draw by draw
    blob: str | None = None
    replay: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


def replay_command(name: str, subject: Subject, hypothesis_profile: str, blob: str | None) -> str:
    cmd = (f"GDN_IMPL={shlex.quote(subject.spec)} GDN_PROFILE={subject.profile} python -m "
           f"gdncheck.conformance.properties -k {name} --hypothesis-profile {hypothesis_profile}")
    return cmd + (f" --replay {shlex.quote(blob)}" if blob else "")


def make_settings(hypothesis_profile: str, max_examples: int | None, shrink: bool):
    register_profiles()
    parent = settings.get_profile(hypothesis_profile)
    phases = tuple(p for p in parent.phases if shrink or p != Phase.shrink)
    checks = list(parent.suppress_health_check) + [HealthCheck.filter_too_much, HealthCheck.too_slow]
    kw = {"max_examples": max_examples} if max_examples else {}
    return settings(parent=parent, phases=phases, suppress_health_check=checks, print_blob=True, **kw)


def run_property(name: str, subject: Subject | None = None, *, max_examples: int | None = None,
                 hypothesis_profile: str = "ci", shrink: bool = True, replay: str | None = None) -> PropertyResult:
    """Search one property; never raises for a failure of the implementation (it is the result)."""
    if name not in PROPERTIES:
        raise GDNError(f"no property {name!r}; properties: {', '.join(sorted(PROPERTIES))}")
    p = PROPERTIES[name]
    subject = subject or subject_from_env()
    counts = {"examples": 0, "skipped": 0}
    skip_reason: list[str] = []

    def test(data):
        counts["examples"] += 1
        try:
            p.fn(subject, data)
        except PropertySkip as exc:
            skip_reason.append(str(exc))

    test.__name__ = test.__qualname__ = name
    wrapped = make_settings(hypothesis_profile, max_examples, shrink)(given(data=st.data())(test))
    if replay:
        wrapped = reproduce_failure(hyp_version, replay.encode() if isinstance(replay, str) else replay)(wrapped)
    logging.getLogger("gdncheck").setLevel(logging.ERROR)  # the seq-len reset warning is part of the programs
    start = time.perf_counter()
    result = PropertyResult(name, p.chapter, subject.spec, subject.profile, "pass", 0.0, 0)
    try:
        wrapped()
    except Exception as exc:  # noqa: BLE001 - the property's failure (or the implementation's crash)
        notes = [str(n) for n in getattr(exc, "__notes__", [])]
        blob = next((m.group(2) for n in notes for m in [BLOB.search(n)] if m), None)
        result.status = "fail"
        result.message = f"{type(exc).__name__}: {exc}" if not isinstance(exc, AssertionError) else str(exc)
        result.notes = [n for n in notes if "reproduce_failure" not in n]
        result.blob = blob
        result.replay = replay_command(name, subject, hypothesis_profile, blob)
    result.seconds = time.perf_counter() - start
    result.examples = counts["examples"]
    if result.status == "pass" and skip_reason:
        result.status, result.message = "skip", skip_reason[0]
    return result


def format_result(r: PropertyResult) -> str:
    head = (f"{r.status.upper():<5} {r.name} [{r.implementation}, {r.profile}] {r.examples} example(s), "
            f"{r.seconds:.1f} s")
    if r.status == "skip":
        return f"{head}: {r.message}"
    if r.status != "fail":
        return head
    lines = [head, *("      " + line for line in r.message.splitlines()), *("      " + n for n in r.notes)]
    if r.blob:
        lines.append(f"      blob: {r.blob}")
    lines.append(f"      replay: {r.replay}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m gdncheck.conformance.properties",
                       description="Run the GDN property suite against GDN_IMPL in GDN_PROFILE.")
    ap.add_argument("-k", dest="names", action="append", help="properties whose name contains this (repeatable)")
    ap.add_argument("--impl", help="reference | triton | MODULE:CALLABLE (default: GDN_IMPL, else reference)")
    ap.add_argument("--profile", help="f32 | bf16 | f16 (default: GDN_PROFILE, else f32)")
    ap.add_argument("--max-examples", type=int, help="examples per property (default: the Hypothesis profile's)")
    ap.add_argument("--hypothesis-profile", default=None, choices=("dev", "ci", "nightly"),
                    help="default: GDN_HYPOTHESIS_PROFILE, else ci under CI, else dev")
    ap.add_argument("--replay", metavar="BLOB", help="replay one failure (with -k NAME)")
    ap.add_argument("--no-shrink", action="store_true", help="report the first failing example as found")
    ap.add_argument("--list", action="store_true", help="list the properties and exit")
    args = ap.parse_args(argv)
    limit_blas_threads()
    if args.list:
        for p in PROPERTIES.values():
            print(f"{p.name:<28} {p.chapter:<12} {'once ' if p.once else ''}{p.doc}")
        return 0
    names = [n for n in sorted(PROPERTIES) if not args.names or any(k in n for k in args.names)]
    if not names:
        print(f"no property matches {args.names}", file=sys.stderr)
        return 2
    hyp = args.hypothesis_profile or os.environ.get("GDN_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI")
                                                                                  else "dev")
    subject = subject_from_env(args.impl, args.profile)
    failed = 0
    for name in names:
        r = run_property(name, subject, max_examples=args.max_examples, hypothesis_profile=hyp,
                         shrink=not args.no_shrink, replay=args.replay if len(names) == 1 else None)
        print(format_result(r), flush=True)
        failed += r.status == "fail"
    print(f"{len(names) - failed}/{len(names)} properties hold [{subject.env()}, hypothesis profile {hyp}]")
    return 1 if failed else 0
