"""The failing cases of a verify summary in groups: where they first diverge, and their likely causes.

``gdncheck verify`` prints these groups above its one line per failing case, so that a port failing
every case reads "32 first diverge at gated_norm/core_gated" before 32 case lines. The first
divergence groups are the Markdown summary's (:func:`gdncheck.reports.model.build`'s
``first_stages``: a stage, or the reason of a failure without a tensor), each split by the tensor
that diverges there; the likely causes group the cases by their diagnosis (docs/verify.md, "The
likely cause"): the bug class a case matches, or why it has none. Both count cases of status
``fail`` only, each case once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gdncheck.conformance.judge.diagnose import state_handling
from gdncheck.untrusted import safe_text

#: groups of one kind printed; the others are counted on one line
MAX_GROUPS = 6
#: the likely-cause group of cases without a diagnosis (none asked for, or nothing to compare)
NO_DIAGNOSIS = "no diagnosis"


@dataclass
class Group:
    label: str
    cases: list[str] = field(default_factory=list)  # case ids, in the summary's order

    @property
    def count(self) -> int:
        return len(self.cases)


@dataclass
class Groups:
    cases: int  # cases in the summary
    failed: list[str]  # the failing cases' ids, in the summary's order
    stages: list[Group]  # first divergence: "stage/tensor" (or the stage, or a reason), most cases first
    causes: list[Group]  # likely cause, most cases first

    def lines(self, limit: int = MAX_GROUPS) -> list[str]:
        """``32 of 50 case(s) fail:`` then a line per group (count, what), at most ``limit`` of each kind."""
        if not self.failed:
            return []
        width = len(str(len(self.failed)))
        out = [f"{len(self.failed)} of {self.cases} case(s) fail:"]
        causes = [] if [g.label for g in self.causes] == [NO_DIAGNOSIS] else self.causes  # --diagnose 0
        lone = [c for c in self.failed if self.aside(c)]
        for kind, groups, say in (("stage", self.stages, "first diverge at "), ("cause", causes, "likely cause: ")):
            for g in groups[:limit]:
                out.append(safe_text(f"  {g.count:>{width}} {say}{g.label}"))
            rest = groups[limit:]
            if rest:
                what = "first diverge elsewhere" if kind == "stage" else "have other likely causes"
                out.append(f"  {sum(g.count for g in rest):>{width}} {what} ({len(rest)} more group(s): "
                           f"see the summary)")
            if kind == "stage" and lone:  # after the stage groups, apart from their counts
                lead = self.lead()
                out.append(safe_text(f"  ({len(lone)} case(s) fail alone, apparently unrelated to the {lead.count} "
                                     f"that first diverge at {lead.label}: {', '.join(lone)}, printed after them)"))
        return out


    def lead(self) -> Group | None:
        """The failure most cases share: the largest first-divergence group, when it holds at least two
        cases and more than any other group (None: no group leads; the earliest stage does)."""
        if not self.stages or self.stages[0].count < 2:
            return None
        if len(self.stages) > 1 and self.stages[1].count >= self.stages[0].count:
            return None
        return self.stages[0]

    def lead_case(self, earliest: str | None) -> str | None:
        """The case printed in full first: of the leading group (:meth:`lead`), its case earliest in the
        layer if ``earliest`` is one of them, else its first; without a leading group, ``earliest``."""
        lead = self.lead()
        if lead is None:
            return earliest
        return earliest if earliest in lead.cases else lead.cases[0]

    def aside(self, case: str) -> str | None:
        """What is said under a case that alone fails the way it does while most fail otherwise: a
        failure only it shows, apparently unrelated to the leading group's, printed after that group."""
        lead = self.lead()
        if lead is None or case in lead.cases:
            return None
        g = next((g for g in self.stages if case in g.cases), None)
        if g is None or g.count != 1:
            return None
        # a case named the same bug class as the group's is related, whatever its first stage
        mine = next((c.label for c in self.causes if case in c.cases), None)
        if mine and mine.startswith("matches: ") and any(lead_case in c.cases for c in self.causes
                                                          if c.label == mine for lead_case in lead.cases):
            return None
        return (f"only this case first diverges at {g.label}: apparently unrelated to the {lead.count} case(s) "
                f"that first diverge at {lead.label}, printed after them")


def cause_label(diagnosis: dict | None) -> str:
    """The likely-cause group of a failing case's diagnosis (the summary's ``diagnosis``)."""
    if not isinstance(diagnosis, dict):  # --diagnose 0, or nothing to compare (the port raised)
        return NO_DIAGNOSIS
    verdict = diagnosis.get("verdict")
    if verdict == "matches":
        return f"matches: {diagnosis.get('bug_class') or diagnosis.get('candidate')}"
    if verdict == "none":
        return "no known bug class matches"
    if verdict == "ambiguous":  # the case's own line names the classes: so does its group
        classes = [diagnosis.get("bug_class"), *(diagnosis.get("alternatives") or [])]
        return "ambiguous: " + " or ".join(str(c) for c in classes if c)
    if verdict == "skipped":
        return str(diagnosis.get("text") or "not diagnosed")
    if verdict == "error":
        return "no diagnosis (the diagnosis failed: see the case)"
    return str(diagnosis.get("text") or NO_DIAGNOSIS)


def failure_groups(doc: dict) -> Groups:
    """The groups of a verify summary document (``Summary.to_json()`` or a summary file's JSON)."""
    from gdncheck.reports.model import build  # the Markdown summary's grouping, not a copy of it

    # the view of the failing cases only, without their records: the groups read a case's first
    # divergence and diagnosis, nothing else (a view of every record costs a second on a large suite)
    view = build({**doc, "cases": [{**c, "records": []} for c in doc["cases"] if c.get("status") == "fail"]})
    failing = view.cases
    # a commit's state, or a state a call left wrong beside right outputs: the state's handling, not
    # the stage that produced the tensor (diagnose.state_handling)
    handled = {c["id"]: state_handling(c.get("first_divergence"), c.get("records") or [])
               for c in doc["cases"] if c.get("status") == "fail"}
    stages: list[Group] = []
    for key, _ in view.first_stages:  # stage (or reason), most cases first
        members = view.first_cases[key]

        def where(c, key=key):
            h = handled.get(c.id)
            return (f"state handling at {h['op']}" if h else key), c.first.tensor

        by_label = Counter(where(c) for c in members)
        for (at, tensor), _ in by_label.most_common():
            label = f"{at}/{tensor}" if tensor and at != tensor else at
            stages.append(Group(label, [c.id for c in members if where(c) == (at, tensor)]))
    grouped = {i for g in stages for i in g.cases}
    lost = [c.id for c in failing if c.id not in grouped]
    if lost:
        stages.append(Group("no recorded first divergence", lost))
    causes: dict[str, Group] = {}
    for c in failing:
        label = cause_label(c.raw.get("diagnosis"))
        causes.setdefault(label, Group(label)).cases.append(c.id)
    # a named bug class first, then the cases without one; most cases first, ties in order of appearance
    ordered = sorted(causes.values(), key=lambda g: (not g.label.startswith("matches: "), -g.count))
    return Groups(len(doc["cases"]), [c.id for c in failing], stages, ordered)
