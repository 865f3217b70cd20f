"""The file names a run of some cases writes into one outputs folder, checked before anything runs
or is judged (:func:`plan_names`): ``gdncheck run`` skips a case whose file would overwrite another
use's, and ``verify`` reports the same case unusable (a bad manifest entry, exit 2), never a port
failure. One rule for both: the run writes exactly the names verify reads."""

from __future__ import annotations

import re

from gdncheck.untrusted import is_lock_name, one_line

#: File names a run never writes: verify's summaries, gdncheck's lock files and folder markers
_RESERVED = re.compile(r"^(verify-summary-[^/]*\.json|gate-summary\.json|gate-junit\.xml|\.gdncheck[^/]*)$")
#: The longest file name (one path component) most file systems take, in bytes (NAME_MAX)
NAME_MAX = 255


def plan_names(entries: list[dict], stage_isolated: bool = False) -> dict[str, str]:
    """Every file name a run of ``entries`` will write into its folder, checked before anything runs:
    ``{case id: why it cannot run}`` for each case whose outputs or snapshot file name is too long
    (over :data:`NAME_MAX` bytes), reserved (a verify summary, a lock file), or is another use's file
    (another case's outputs file, another case's snapshot file: the later one loses). Names that
    differ only in case are one file on macOS and Windows, so they collide too."""
    uses: dict[str, str] = {}  # casefolded name -> its use
    problems: dict[str, str] = {}
    for entry in entries:  # the outputs files first: a case's own name is the first claim on it
        uses.setdefault(f"{entry['id']}.safetensors".casefold(), f"the outputs file of case {entry['id']}")
    for entry in entries:
        cid = entry["id"]
        name = f"{cid}.safetensors"
        owner = uses.get(name.casefold())
        if len(name.encode("utf-8")) > NAME_MAX:
            problems[cid] = (f"its outputs file name {one_line(name, 80)!r} is {len(name.encode('utf-8'))} bytes long, "
                             f"over the {NAME_MAX} a file system takes")
            continue
        if owner != f"the outputs file of case {cid}":
            problems[cid] = f"its outputs file {name!r} is also {owner} (names that differ only in case are one file)"
            continue
        if stage_isolated:
            continue  # no program step runs, so no snapshot file is written
        own: set[str] = set()
        for i, step in enumerate(entry.get("program", [])):
            if step.get("op") != "save" or not isinstance(step.get("file"), str):
                continue
            snap = step["file"]
            use = f"the snapshot file of step {i} of case {cid}"
            folded = snap.casefold()
            if any(len(part.encode("utf-8")) > NAME_MAX for part in snap.split("/")):
                problems[cid] = (f"{use}, {one_line(snap, 80)!r}, has a name over the {NAME_MAX} bytes a file "
                                 f"system takes")
                break
            if _RESERVED.match(snap.rsplit("/", 1)[-1]) or is_lock_name(snap.rsplit("/", 1)[-1]):
                problems[cid] = (f"{use} is named {snap!r}, a name gdncheck keeps for its own files (verify summaries, "
                                 f"lock files): the summary would replace it, or it the summary")
                break
            if folded in uses and folded not in own:
                problems[cid] = f"{use} is named {snap!r}, which is also {uses[folded]}: it would overwrite it"
                break
            own.add(folded)
        else:
            for folded in own:
                uses.setdefault(folded, f"the snapshot file of case {cid}")
    return problems
