"""The pytest plugin (entry point `pytest11`): gdncheck's conformance suite inside a port's own
test run.

    pytest --gdncheck-impl myport:factory --gdncheck-profile bf16 [--gdncheck-fixtures DIR]
           [--gdncheck-option KEY=VALUE ...] [--gdncheck-xfails FILE] [--gdncheck-out DIR]
           [--gdncheck-stage-isolated] [--gdncheck-properties] [-k decode] [-m "not long"]

Without `--gdncheck-impl` it does nothing; with it, one test per fixture case (its id the case id,
its markers the case's tags and `gdncheck_case`), run as `gdncheck run` and judged as `gdncheck
verify` do. Outputs are kept in `--gdncheck-out`, else `.gdncheck-out/`, a folder the plugin owns.
Every pytest run where gdncheck is installed loads this module, so importing it must stay cheap:
the judge is imported when the first test runs.

Each option, the xfail semantics and the output folder: docs/plugins.md, "In pytest and from Python".
"""

from __future__ import annotations

import functools
import shutil
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
    g.addoption("--gdncheck-max-examples", metavar="N",
                help=f"examples per property, {MIN_EXAMPLES}..{MAX_EXAMPLES} (default: the Hypothesis profile's)")
    g.addoption("--gdncheck-hypothesis-profile", default="ci", choices=("dev", "ci", "nightly"),
                help="Hypothesis profile of the property tests (default ci: derandomized)")
    g.addoption("--gdncheck-out", metavar="DIR",
                help=f"write the implementation's outputs here, kept for the repro lines and gdncheck verify / "
                     f"report (default: {DEFAULT_OUT}/ under pytest's rootdir, replaced at each run)")
    g.addoption("--gdncheck-option", action="append", default=[], metavar="KEY=VALUE",
                help="an option for the implementation's factory (repeatable; as gdncheck run --option: one it "
                     "does not take is refused before anything runs)")
    g.addoption("--gdncheck-xfails", metavar="FILE",
                help="known failures (IMPL PROFILE CASE WHAT  # reason; docs/verify.md): listed cases are "
                     "xfail(strict=True): failing only in the listed tensors or stages XFAIL, passing XPASS(strict)")
    g.addoption("--gdncheck-diagnose", type=_count, default=8, metavar="N",
                help="name the likely cause of the first N failing cases (default 8; 0: none), as gdncheck "
                     "verify --diagnose does")


def _count(text: str) -> int:
    """A number of cases, 0 or more (``--gdncheck-diagnose``)."""
    import argparse

    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a number of cases (0 or more), found {text!r}")
    return n


def _examples(text: str | None) -> int | None:
    """``--gdncheck-max-examples``: None (the profile's), or an integer in
    :data:`MIN_EXAMPLES`..:data:`MAX_EXAMPLES`; else a one-line usage error (checked when the plugin
    is active, not by argparse, whose error is pytest's usage block)."""
    if text is None:
        return None
    try:
        n = int(str(text).strip())
    except ValueError:
        n = None
    if n is None or not MIN_EXAMPLES <= n <= MAX_EXAMPLES:
        from gdncheck.untrusted import one_line

        shown = one_line(repr(str(text)))
        raise pytest.UsageError(f"gdncheck: --gdncheck-max-examples: expected a number of examples per property "
                                f"from {MIN_EXAMPLES} to {MAX_EXAMPLES}, found {shown[:60]}"
                                + ("..." if len(shown) > 60 else ""))
    return n


#: the range of --gdncheck-max-examples (a Hypothesis search of 100000 examples is hours already)
MIN_EXAMPLES, MAX_EXAMPLES = 1, 100_000
#: the default outputs folder, under pytest's rootdir
DEFAULT_OUT = ".gdncheck-out"
#: the marker of an outputs folder the plugin made (and so may replace)
MARKER = ".gdncheck-pytest"


class _Run:
    """What the session's gdncheck tests share: the options, the fixture suite, the outputs folder."""

    def __init__(self, config: pytest.Config):
        from gdncheck.conformance.judge.xfails import load_xfails
        from gdncheck.conformance.ports.plugin import load_checked_factory, parse_options
        from gdncheck.errors import GDNError
        from gdncheck.fixtures.manifest import load_manifest, refuse_output_in_suite
        from gdncheck.fixtures.packaged import default_suite
        from gdncheck.untrusted import one_line

        opt = config.option
        self.spec: str = opt.gdncheck_impl
        self.profile: str = opt.gdncheck_profile
        self.stage_isolated: bool = opt.gdncheck_stage_isolated
        try:
            self.options = parse_options(opt.gdncheck_option)
        except GDNError as exc:
            raise pytest.UsageError(f"gdncheck: --gdncheck-option: {one_line(exc)}") from None
        try:
            # the CLI's own checks (parse_spec, check_options): a typo, a path, a callable that is no
            # factory (os:getcwd), an option it does not take is one usage error before anything runs,
            # not one failure per case
            self.factory = load_checked_factory(self.spec, self.options)
        except GDNError as exc:
            flags = "--gdncheck-impl" + (" / --gdncheck-option" if self.options else "")
            raise pytest.UsageError(f"gdncheck: {flags}: {one_line(exc)}") from None
        try:
            self.xfails = load_xfails(opt.gdncheck_xfails) if opt.gdncheck_xfails else None
        except GDNError as exc:
            raise pytest.UsageError(f"gdncheck: --gdncheck-xfails: {one_line(exc)}") from None
        self.diagnose = opt.gdncheck_diagnose
        self.max_examples = _examples(opt.gdncheck_max_examples)
        self._diagnoser = None
        try:
            self.fixtures = Path(opt.gdncheck_fixtures) if opt.gdncheck_fixtures else default_suite()
            self.manifest = load_manifest(self.fixtures)
        except GDNError as exc:
            raise pytest.UsageError(f"gdncheck: {one_line(exc)}") from None
        given = opt.gdncheck_out is not None
        self.out = (Path(opt.gdncheck_out) if given else Path(config.rootpath) / DEFAULT_OUT).absolute()
        try:  # never into (or around) a fixture suite: one usage error, nothing made there
            refuse_output_in_suite(self.out, self.fixtures, "--gdncheck-out")
        except GDNError as exc:
            raise pytest.UsageError(f"gdncheck: {one_line(exc)}") from None
        flag = "--gdncheck-out" if given else "the default outputs folder"
        try:  # given or not, the folder is the plugin's: marked, replaced whole; someone's is refused
            if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller made it
                self.out.mkdir(parents=True, exist_ok=True)
            else:
                _fresh_folder(self.out, flag)
        except OSError as exc:
            raise pytest.UsageError(f"gdncheck: --gdncheck-out {one_line(self.out)}: expected a folder to "
                                    f"write into, found {one_line(exc.strerror or exc)}") from None

    def diagnoser(self):
        """The likely-cause hook of verify, one for the session (its limit counts the session's cases)."""
        if self.diagnose <= 0:
            return None
        if self._diagnoser is None:
            from gdncheck.conformance.meta.catalogue import mutant_diagnoser

            self._diagnoser = mutant_diagnoser(self.fixtures, limit=self.diagnose)
        return self._diagnoser

    def xfail_of(self, case: str):
        """The first known-failures entry that speaks of ``case`` for this implementation, or None."""
        return next((x for x in self.xfails or () if x.applies(self.spec, self.profile, case)), None)


def _fresh_folder(out: Path, flag: str = "the default outputs folder") -> None:
    """Make the outputs folder (``--gdncheck-out`` or the default) anew: one the plugin made before
    (its marker) is replaced whole, so no outputs file of an earlier run is judged or mixed into this
    run's; any other folder holding anything is refused (it is someone's), never emptied or written
    into; a link is never followed."""
    if out.is_symlink():
        raise pytest.UsageError(f"gdncheck: {flag} {out}: expected the plugin's outputs folder, found a symbolic "
                                "link (not followed: the plugin replaces its folder whole)")
    if out.exists() and not out.is_dir():
        raise pytest.UsageError(f"gdncheck: {flag} {out}: expected the plugin's outputs folder, found a file "
                                "(remove it, or give --gdncheck-out DIR)")
    if out.is_dir() and any(out.iterdir()):
        if not (out / MARKER).is_file() or (out / MARKER).is_symlink():
            raise pytest.UsageError(f"gdncheck: {flag} {out}: expected the plugin's own outputs folder (with its "
                                    f"{MARKER} marker) or none, found a folder holding other files; it is left as "
                                    "it is (remove it, or give --gdncheck-out a new folder)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("the outputs of gdncheck's pytest plugin: replaced whole at each run\n")
    (out / ".gitignore").write_text("# made by gdncheck's pytest plugin\n*\n")


_KEY = pytest.StashKey[_Run]()
#: a case test's user property: what judged it, ``port`` (a tensor of the port judged, not a known failure),
#: ``checks`` (the port judged without a tensor: an expected error, a raise), ``known`` (a known failure),
#: ``gdncheck`` (its own config parser, the port never called) or ``none`` (not applicable, skipped)
JUDGED = "gdncheck_judged"
class _Coverage:
    """The coverage rule in pytest (registered by :func:`pytest_configure` when the plugin is active):
    counts what judged each case test — on the controller too under pytest-xdist, whose reports carry
    the user property — and makes a session that judged nothing of the port (every case not applicable,
    or answered by gdncheck's own config parser before the port was called) an error, never a pass."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.counts: dict[str, int] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for key, value in getattr(report, "user_properties", ()):
            if key == JUDGED:
                self.counts[value] = self.counts.get(value, 0) + 1

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if hasattr(self.config, "workerinput") or not self.counts or self.counts.get("port", 0):
            return
        own, none = self.counts.get("gdncheck", 0), self.counts.get("none", 0)
        checks, known = self.counts.get("checks", 0), self.counts.get("known", 0)
        if checks or known:  # the port was called, but no tensor of it was shown to conform (as verify's coverage)
            line = (f"gdncheck: no tensor of the port was judged to conform: of {sum(self.counts.values())} case "
                    f"test(s), {known} known failure(s) (a known failure explains a failure, it shows nothing "
                    f"conforms), {checks} judged no tensor (expected errors, raises), {own} answered by gdncheck's own "
                    f"config parser, {none} not applicable")
        else:
            line = (f"gdncheck: nothing of the port was judged: of {own + none} case test(s), {own} were answered by "
                    f"gdncheck's own config parser before the port was called and {none} not applicable")
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(line, red=True)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("gdncheck_impl", None):
        return
    run = _Run(config)
    config.stash[_KEY] = run
    config.pluginmanager.register(_Coverage(config), "gdncheck-coverage")
    config.addinivalue_line("markers", "gdncheck_case: a gdncheck conformance case (the plugin's)")
    config.addinivalue_line("markers", "gdncheck_property: a property of gdncheck's Hypothesis suite")
    for tag in sorted({t for c in run.manifest["cases"] for t in c.get("tags", [])}):
        config.addinivalue_line("markers", f"{tag}: gdncheck fixture tag")


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    run = config.stash.get(_KEY, None)
    if run is None:
        return None
    opts = "".join(f" {k}={v}" for k, v in run.options.items())
    xf = f", known failures {run.xfails[0].file if run.xfails else config.option.gdncheck_xfails}" \
        if run.xfails is not None else ""
    lines = [f"gdncheck: {run.spec}{opts}, profile {run.profile}{xf}; outputs kept in {run.out} (the repro lines "
             "point there)"]
    if run.xfails:  # entries no case of this session can match: a typo, another profile (a warning)
        from gdncheck.conformance.judge.xfails import unmatched, unmatched_line

        ids = [c["id"] for c in run.manifest["cases"]]
        applied = {x for x in run.xfails if any(x.applies(run.spec, run.profile, i) for i in ids)}
        lost = [(x, why) for x, why in unmatched(run.xfails, applied, profiles=[run.profile], impl_names=set(),
                                                  suite_ids=ids)]
        if lost:
            lines.append("gdncheck: warning: " + unmatched_line(lost))
    return lines


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
            x = run.xfail_of(entry["id"])
            if x is not None:  # strict: a listed case that passes (a stale entry) fails
                item.add_marker(pytest.mark.xfail(reason=f"known failure ({x.where()}): {x.reason}", strict=True,
                                                  raises=KnownFailure))
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


class KnownFailure(NonConforming):
    """A case that fails only where its known-failures entry allows (an expected failure, XFAIL)."""


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
        from gdncheck.conformance.judge.records import own_check
        from gdncheck.conformance.judge.verify import verify
        from gdncheck.conformance.ports.run import run_impl
        from gdncheck.errors import GDNError
        from gdncheck.untrusted import one_line

        from . import case_text

        run = self.config.stash[_KEY]
        case = self.entry["id"]
        if run.stage_isolated and self.entry["kind"] == "error":
            pytest.skip("stage-isolated mode: an expected-error case is judged end to end only")
        try:  # a refusal (a file there the plugin did not make, a folder taken by another run): one line
            run_impl(run.spec, run.fixtures, run.out, run.profile, cases=[case], options=run.options,
                     stage_isolated=run.stage_isolated)
            summary = verify(run.fixtures, run.out, run.profile, cases=[case], stage_isolated=run.stage_isolated,
                             diagnose=run.diagnoser(), xfails=run.xfails)
        except GDNError as exc:
            pytest.fail(f"gdncheck could not run this case: {one_line(exc)}", pytrace=False)
        report = next(c for c in summary.cases if c.id == case)
        known = summary.known_failures().get(case)
        # what judged this case (the coverage rule, counted at the session's end: pytest_sessionfinish)
        self.user_properties.append((JUDGED, "gdncheck" if own_check(report) else
                                     "none" if report.status not in ("pass", "fail") else
                                     "known" if known is not None else "port" if report.judged else "checks"))
        if report.status == "not_applicable":
            pytest.skip(f"not applicable: {report.message}")
        marked = self.get_closest_marker("xfail") is not None
        if known is not None:
            text = f"known failure ({summary.xfails['file']}:{known['line']}: {known['reason']})"
            if not marked:  # an entry naming the implementation as it names itself: known at run time only
                pytest.xfail(text)
            raise KnownFailure(f"{text}\n{case_text(report)}")
        if report.status != "pass":
            refused = next((r for r in (summary.xfails or {}).get("refused", []) if r["case"] == case), None)
            why = (f"known failure ({summary.xfails['file']}:{refused['line']}) does not excuse this case: "
                   f"{refused['why']} (the coverage rule)\n") if refused else ""
            raise NonConforming(why + case_text(report))
        stale = (summary.xfails or {}).get("stale")
        if stale and not marked:  # strict, as a marked case's XPASS(strict)
            x = stale[0]
            raise NonConforming(f"stale known failure ({summary.xfails['file']}:{x['line']}: {x['reason']}): the "
                                f"case passes now; delete the entry")

    def reportinfo(self):
        run = self.config.stash[_KEY]
        return run.fixtures / "manifest.json", None, f"gdncheck case {self.name} [{run.profile}]"


class PropertyItem(_Item):
    def runtest(self) -> None:
        from gdncheck.conformance.properties.registry import Subject
        from gdncheck.conformance.properties.runner import format_result, run_property

        run = self.config.stash[_KEY]
        factory = functools.partial(run.factory, **run.options) if run.options else run.factory
        r = run_property(self.name, Subject(run.spec, run.profile, factory),
                         hypothesis_profile=self.config.getoption("gdncheck_hypothesis_profile"),
                         max_examples=run.max_examples)
        if r.status == "skip":
            pytest.skip(r.message)
        if r.status != "pass":
            raise NonConforming(format_result(r))

    def reportinfo(self):
        run = self.config.stash[_KEY]
        return Path(__file__), None, f"gdncheck property {self.name} [{run.spec}, {run.profile}]"
