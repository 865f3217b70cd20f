"""What a newcomer follows to reproduce the engines' rows from a clean clone holds (issue 43, item 7): every
link of the docs into the repository resolves inside it (the committed docs/engines.md had 30 vLLM-Triton
repro links into ../work/main/, a folder of the machine that wrote it), every repository path the docs name
in code exists (a test file was named at the wrong path), the numbers of an engine's own page agree with the
committed matrix (the ONNX Runtime page said f32 "1 / 36", the matrix 0 / 37), an install line of the
engines table is its registry entry's (keras differed), and a page written inside a checkout links its
repros inside that checkout, never into the one gdncheck runs from."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gdncheck.conformance.engines import registry
from gdncheck.reports import engines as pages

ROOT = Path(__file__).resolve().parents[2]
#: the pages of the engines live in their folders (conformance/engines/<name>/README.md): checked as docs
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
        *sorted(p for folder in ("examples", "conformance") for p in (ROOT / folder).rglob("*.md")
                if "node_modules" not in p.parts)]
#: a path of the repository as the docs name it in code: a top-level folder of it, a file with an extension
REPO_PATH = re.compile(r"`((?:tests|docs|examples|conformance|scripts|reports|gdncheck|fixtures|gate|reference|"
                       r"gpu_impl)/[A-Za-z0-9_./-]+\.(?:py|md|js|json|j2|yml|yaml|toml|txt|sh))`")


def _prose(path: Path) -> str:
    return re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_into_the_repository_resolves_inside_it(doc):
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(doc)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor of the page
        path = target.split("#")[0]
        resolved = (doc.parent / path).resolve()
        if not resolved.exists() or not resolved.is_relative_to(ROOT):
            bad.append(target)
    assert not bad, f"{doc.relative_to(ROOT)}: {len(bad)} link(s) that do not resolve in the repository: {bad[:5]}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_named_in_code_exists(doc):
    missing = sorted({p for p in REPO_PATH.findall(_prose(doc)) if not (ROOT / p).exists()})
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


def _matrix_rows() -> dict[tuple[str, str], dict]:
    """The committed matrix's count rows: (engine, profile) -> cases, pass, fail, n/a."""
    text = (ROOT / "docs" / "engines.md").read_text(encoding="utf-8")
    block = text.split(pages.STABLE_BEGIN)[1].split(pages.STABLE_END)[0]
    rows = {}
    for m in re.finditer(r"^\| ([a-z-]+) \| [a-z-]+ \| (f32|bf16|f16) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|", block,
                         re.M):
        rows[(m[1], m[2])] = {"cases": int(m[3]), "pass": int(m[4]), "fail": int(m[5]), "na": int(m[6])}
    return rows


def test_an_engine_pages_counts_are_the_committed_matrixs():
    rows = _matrix_rows()
    assert rows[("onnxruntime", "f32")] == {"cases": 63, "pass": 0, "fail": 60, "na": 3}  # the 104-case suite
    checked = 0
    for page in sorted((ROOT / "conformance" / "engines").glob("*/README.md")):
        name = page.parent.name.replace("_", "-")
        for m in re.finditer(r"^\| (f32|bf16|f16) \| (\d+) / (\d+)(?: / (\d+) of (\d+))? \|", page.read_text(), re.M):
            row = rows[(name, m[1])]
            said = {"pass": int(m[2]), "fail": int(m[3])}
            want = {"pass": row["pass"], "fail": row["fail"]}
            if m[4] is not None:
                said.update(na=int(m[4]), cases=int(m[5]))
                want.update(na=row["na"], cases=row["cases"])
            assert said == want, f"{page.relative_to(ROOT)}, {m[1]}: {said}, the committed matrix {want}"
            checked += 1
    assert checked >= 4  # onnxruntime's and keras' tables


def test_an_install_line_of_the_engines_table_is_its_registry_entrys():
    text = (ROOT / "docs" / "engines.md").read_text(encoding="utf-8")
    for name, eng in registry.ENGINES.items():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, name
        install = re.split(r"(?<!\\)\|", row)[3]
        for span in re.findall(r"`([^`]+)`", install):
            if "pip install" in span:
                assert span in (eng.install or ""), f"{name}: the table says {span!r}, the registry {eng.install!r}"


def test_a_page_links_its_repros_inside_its_own_checkout(tmp_path):
    repro = "conformance/engines/sglang/repros/sglang_softplus.py"
    other = tmp_path / "clone"
    (other / "docs").mkdir(parents=True)
    (other / repro).parent.mkdir(parents=True)
    (other / repro).write_text("")
    assert pages.repro_href(repro, other / "docs") == "../" + repro
    assert pages.repro_href(repro, tmp_path / "elsewhere") == repro  # no checkout around it: from the root
    assert pages.repro_href(repro, ROOT / "docs") == "../" + repro
