"""The stage every fuzz draw plays on: a small fixture suite, a port's outputs, and a sentinel folder,
in a fresh temporary folder per draw; one command run in-process; and the checks every draw must pass.

Every draw asserts the same contract (issue 11, item 10): the exit code is 0, 1 or 2 and agrees with
the verdict the command wrote, no traceback is printed, nothing is written or changed outside the
output folder (every file of the draw's temporary folder but the output folder is compared byte for
byte: the fixtures, the sentinel, and wherever ``..`` or an absolute name would lead), and the
untouched case is still judged (``pass``) whenever the mutation was local to another case.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gdncheck.cli import main
from gdncheck.conformance.ports.run import run_impl
from gdncheck.fixtures.manifest import DEFAULT_DIR
from tests.helpers import default_case_id

#: the case the mutations hit, the case that must still be judged, the case that saves snapshot files
TARGET, WITNESS, SNAPSHOT = (default_case_id("prefill"), default_case_id("decode"),
                             default_case_id("snapshot-replay"))
CASES = (WITNESS, TARGET, SNAPSHOT)  # the witness first: a duplicate made by a mutation is the later entry


@dataclass
class Base:
    """Built once per session: the small suite and a correct port's outputs of its cases."""

    fixtures: Path
    outputs: Path


def build_base(root: Path) -> Base:
    fixtures, outputs = root / "fixtures", root / "outputs"
    fixtures.mkdir(parents=True)
    doc = json.loads((DEFAULT_DIR / "manifest.json").read_text())
    doc["cases"] = [c for c in doc["cases"] if c["id"] in CASES]
    doc["cases"].sort(key=lambda c: CASES.index(c["id"]))
    for c in doc["cases"]:
        shutil.copy(DEFAULT_DIR / c["file"], fixtures / c["file"])
    (fixtures / "manifest.json").write_text(json.dumps(doc, indent=1))
    run_impl("reference", fixtures, outputs, "f64", cases=list(CASES))
    return Base(fixtures, outputs)


@dataclass
class Stage:
    top: Path  # the draw's temporary folder: every file of the draw, and every place a write could escape to
    root: Path  # two levels below ``top``, so that '..' and '../..' from a folder of the stage stay in ``top``
    fixtures: Path
    out: Path
    outside: Path

    def snapshot_files(self) -> list[Path]:
        return sorted(p for p in self.out.iterdir() if p.name.startswith(SNAPSHOT) and ".snapshot" in p.name)

    def everything_but(self, *folders: Path) -> dict[str, bytes | str]:
        """Every entry under ``top`` (bytes compared) except those in ``folders``: what a command may
        not write, change or remove."""
        skip = tuple(str(f.relative_to(self.top)) for f in folders)
        return {k: v for k, v in tree(self.top).items()
                if not any(k == s or k.startswith(s + "/") for s in skip)}


#: a placeholder for the draw's ``top`` folder in hostile names (an absolute name that, followed, would
#: write where the test can see it; never a path of the machine's own, such as /etc or /tmp)
TOP = "@TOP@"


@contextlib.contextmanager
def stage(base: Base) -> Iterator[Stage]:
    with tempfile.TemporaryDirectory(prefix="gdncheck-fuzz-") as tmp:
        top = Path(tmp)
        root = top / "a" / "b"
        st = Stage(top, root, root / "fixtures", root / "out", root / "outside")
        shutil.copytree(base.fixtures, st.fixtures)
        shutil.copytree(base.outputs, st.out)
        st.outside.mkdir()
        (st.outside / "sentinel.safetensors").write_bytes(b"someone else's file")
        yield st


def tree(folder: Path) -> dict[str, bytes | str]:
    """Every entry under ``folder`` (links not followed): file bytes, or what else it is."""
    out: dict[str, bytes | str] = {}
    for p in sorted(folder.rglob("*")):
        key = str(p.relative_to(folder))
        if p.is_symlink():
            out[key] = "link -> " + str(p.readlink())
        elif p.is_file():
            out[key] = p.read_bytes()
        else:
            out[key] = "folder" if p.is_dir() else "special"
    return out


@dataclass
class Ran:
    code: int
    stdout: str
    stderr: str
    summary: dict | None


def run(argv: list[str], summary: Path | None = None) -> Ran:
    """One command in-process; its exit code, its output, the summary it wrote (None if none)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    doc = None
    if summary is not None and summary.is_file():
        doc = json.loads(summary.read_text())
    return Ran(code, out.getvalue(), err.getvalue(), doc)


def check(ran: Ran, *, witness: bool = True) -> None:
    """The contract every draw keeps (the module docstring)."""
    text = ran.stdout + ran.stderr
    assert ran.code in (0, 1, 2), (ran.code, text[-2000:])
    assert "Traceback" not in text and "internal error" not in text, text[-3000:]
    if ran.summary is None:
        assert ran.code == 2 and len(ran.stderr.strip().splitlines()) == 1, text[-2000:]
        return
    assert ran.summary["exit_code"] == ran.code, (ran.summary["verdict"], ran.code)
    verdict = {0: ("conforms",), 1: ("does not conform",), 2: ("inputs unusable", "nothing judged")}[ran.code]
    assert ran.summary["verdict"] in verdict
    if witness:
        status = {c["id"]: c["status"] for c in ran.summary["cases"]}
        assert status.get(WITNESS) == "pass", status


def verify_argv(st: Stage, *cases: str) -> list[str]:
    picked = [a for c in (cases or CASES) for a in ("--case", c)]
    return ["verify", "--fixtures", str(st.fixtures), "--outputs", str(st.out), "--profile", "f32", *picked]
