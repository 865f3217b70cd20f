"""The pytest plugin (entry point ``pytest11``): gdncheck's conformance suite inside a port's own
test run.

    pytest --gdncheck-impl myport:factory --gdncheck-profile bf16 [--gdncheck-fixtures DIR]
           [--gdncheck-stage-isolated] [--gdncheck-properties] [-k decode] [-m "not long"]

Without ``--gdncheck-impl`` it does nothing. With it, the session gets one test per fixture case,
whose id is the case id (``gdncheck-bf16::decode_T12_Hk2_Hv4_dk16_dv16_s0``) and whose markers are the
case's tags plus ``gdncheck_case``, so ``-k`` and ``-m`` select as usual. A test runs the
implementation over its case as ``gdncheck run`` does and judges it as ``gdncheck verify`` does; a
failure is verify's own text (the first divergence, its message, the repro line), a case the
implementation declares not applicable is a skip with its reason. ``--gdncheck-properties`` adds one
test per property of the Hypothesis property suite (marker ``gdncheck_property``).

The plugin is loaded by every pytest run where gdncheck is installed, so importing it must stay
cheap: gdncheck's judge is imported when the first test runs.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from gdncheck.profiles import VERIFY_PROFILES


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("gdncheck", "gdncheck conformance suite (pip install gdncheck)")
    g.addoption("--gdncheck-impl", metavar="MODULE:CALLABLE",
                help="run gdncheck's conformance cases against this implementation factory (docs/plugins.md; the "
                     "module is looked for in the working directory too)")
    g.addoption("--gdncheck-profile", default="f32", choices=VERIFY_PROFILES, help="precision profile (default f32)")
    g.addoption("--gdncheck-fixtures", metavar="DIR",
                help="fixture suite folder (default: the committed suite packaged with gdncheck, checksums verified)")
    g.addoption("--gdncheck-stage-isolated", action="store_true",
                help="run each stage alone from golden inputs (the implementation's run_stage; FORMAT.md §8)")
    g.addoption("--gdncheck-properties", action="store_true",
                help="also collect the Hypothesis property suite, one test per property")
    g.addoption("--gdncheck-max-examples", type=int, metavar="N", help="examples per property (default: the profile's)")
    g.addoption("--gdncheck-hypothesis-profile", default="ci", choices=("dev", "ci", "nightly"),
                help="Hypothesis profile of the property tests (default ci: derandomized)")
    g.addoption("--gdncheck-out", metavar="DIR",
                help="keep the implementation's outputs here (for gdncheck verify / report); default: a temporary "
                     "folder removed at the end")


class _Run:
    """What the session's gdncheck tests share: the options, the fixture suite, the outputs folder."""

    def __init__(self, config: pytest.Config):
        from gdncheck.conformance.ports.plugin import load_checked_factory
        from gdncheck.errors import GDNError
        from gdncheck.fixtures.manifest import load_manifest
        from gdncheck.fixtures.packaged import default_suite
        from gdncheck.untrusted import one_line

        opt = config.option
        self.spec: str = opt.gdncheck_impl
        self.profile: str = opt.gdncheck_profile
        self.stage_isolated: bool = opt.gdncheck_stage_isolated
        try:
            # the CLI's own checks (parse_spec, check_options): a typo, a path, a callable that is no
            # factory (os:getcwd) is one usage error before anything runs, not one failure per case
            self.factory = load_checked_factory(self.spec)
        except GDNError as exc:
            raise pytest.UsageError(f"gdncheck: --gdncheck-impl: {one_line(exc)}") from None
        try:
            self.fixtures = Path(opt.gdncheck_fixtures) if opt.gdncheck_fixtures else default_suite()
            self.manifest = load_manifest(self.fixtures)
        except GDNError as exc:
            raise pytest.UsageError(f"gdncheck: {one_line(exc)}") from None
        self.keep = opt.gdncheck_out is not None
        try:
            self.out = Path(opt.gdncheck_out) if self.keep else Path(tempfile.mkdtemp(prefix="gdncheck-pytest-"))
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise pytest.UsageError(f"gdncheck: --gdncheck-out {one_line(opt.gdncheck_out)}: expected a folder to "
                                    f"write into, found {one_line(exc.strerror or exc)}") from None

    def close(self) -> None:
        if not self.keep:
            shutil.rmtree(self.out, ignore_errors=True)


_KEY = pytest.StashKey[_Run]()


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("gdncheck_impl", None):
        return
    run = _Run(config)
    config.stash[_KEY] = run
    config.addinivalue_line("markers", "gdncheck_case: a gdncheck conformance case (the plugin's)")
    config.addinivalue_line("markers", "gdncheck_property: a property of gdncheck's Hypothesis suite")
    for tag in sorted({t for c in run.manifest["cases"] for t in c.get("tags", [])}):
        config.addinivalue_line("markers", f"{tag}: gdncheck fixture tag")


def pytest_unconfigure(config: pytest.Config) -> None:
    run = config.stash.get(_KEY, None)
    if run is not None:
        run.close()


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselect: the cases are selected like any test
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    run = config.stash.get(_KEY, None)
    if run is None:
        return
    suite = Suite.from_parent(session, name=f"gdncheck-{run.profile}", nodeid=f"gdncheck-{run.profile}")
    items.extend(suite.collect())
    if config.getoption("gdncheck_properties"):
        props = Suite.from_parent(session, name=f"gdncheck-properties-{run.profile}",
                                  nodeid=f"gdncheck-properties-{run.profile}")
        items.extend(props.collect_properties())


class Suite(pytest.Collector):
    """The cases (or properties) of one profile."""

    def collect(self) -> list[pytest.Item]:
        run = self.config.stash[_KEY]
        out = []
        for entry in run.manifest["cases"]:
            item = CaseItem.from_parent(self, name=entry["id"], entry=entry)
            item.add_marker("gdncheck_case")
            for tag in entry.get("tags", []):
                item.add_marker(tag)
            out.append(item)
        return out

    def collect_properties(self) -> list[pytest.Item]:
        from gdncheck.conformance.properties import PROPERTIES

        out = []
        for name in sorted(PROPERTIES):
            item = PropertyItem.from_parent(self, name=name)
            item.add_marker("gdncheck_property")
            out.append(item)
        return out


class NonConforming(Exception):
    """A case or property that does not conform; its text is the whole failure report."""


class _Item(pytest.Item):
    """A gdncheck test: a non-conformance is shown as verify's own text, not a traceback."""

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, NonConforming):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)


class CaseItem(_Item):
    def __init__(self, *, entry: dict, **kw):
        super().__init__(**kw)
        self.entry = entry

    def runtest(self) -> None:
        from gdncheck.conformance.judge.verify import verify
        from gdncheck.conformance.ports.run import run_impl

        from . import case_text

        run = self.config.stash[_KEY]
        case = self.entry["id"]
        if run.stage_isolated and self.entry["kind"] == "error":
            pytest.skip("stage-isolated mode: an expected-error case is judged end to end only")
        run_impl(run.spec, run.fixtures, run.out, run.profile, cases=[case], stage_isolated=run.stage_isolated)
        summary = verify(run.fixtures, run.out, run.profile, cases=[case], stage_isolated=run.stage_isolated)
        report = next(c for c in summary.cases if c.id == case)
        if report.status == "not_applicable":
            pytest.skip(f"not applicable: {report.message}")
        if report.status != "pass":
            raise NonConforming(case_text(report))

    def reportinfo(self):
        run = self.config.stash[_KEY]
        return run.fixtures / "manifest.json", None, f"gdncheck case {self.name} [{run.profile}]"


class PropertyItem(_Item):
    def runtest(self) -> None:
        from gdncheck.conformance.properties.registry import Subject
        from gdncheck.conformance.properties.runner import format_result, run_property

        run = self.config.stash[_KEY]
        r = run_property(self.name, Subject(run.spec, run.profile, run.factory),
                         hypothesis_profile=self.config.getoption("gdncheck_hypothesis_profile"),
                         max_examples=self.config.getoption("gdncheck_max_examples"))
        if r.status == "skip":
            pytest.skip(r.message)
        if r.status != "pass":
            raise NonConforming(format_result(r))

    def reportinfo(self):
        run = self.config.stash[_KEY]
        return Path(__file__), None, f"gdncheck property {self.name} [{run.spec}, {run.profile}]"
