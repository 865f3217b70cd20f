"""``gdncheck engines``: the cross-engine conformance matrix (docs/engines.md)."""

from __future__ import annotations

import argparse

from .console import Console, add_output_arguments

DESCRIPTION = """\
Run every installed engine of the registry (one folder each: conformance/engines/), or those named
with --engine, in every profile it supports, through `gdncheck run` (or the engine's own
program) and `gdncheck verify` (with the likely-cause diagnosis verify's command line gives),
into OUT/<engine>/<profile>/, then write the matrix: OUT/matrix.json, OUT/matrix.md and
OUT/matrix.html (and --markdown FILE, --html FILE).

{engines}

Each engine's row: its versions, how it is judged (end-to-end: its whole layer and state; stage-
isolated: each stage it has, run alone from golden inputs), per profile the pass / fail / n/a
counts, the worst ratio error / bound over passing tensors, and every case that is no clean pass,
classified from verify's summary: deviation (with its float64 adjudication: stage, tensor, error /
bound), convention (declared, e.g. a routing tie), missing_feature (not applicable, with the reason),
engine_crash (the engine raised something that is no FORMAT.md §6 code: a failure, even where the
adapter maps it to an accepted code), unusable. Known findings add an explanation and a standalone
repro script where they match what was measured for them (class, stage, tensor, NaN or not, the
ratio's range) and account for every failing record of the case; a failing case no known finding
explains is marked unexplained, naming the record it does not account for. An engine that is
not installed is a row saying how to install it. Each engine run is bounded by --timeout.

Exit status: 0 the matrix was written and every engine run judged its cases (findings are its
content, not a failure); 1 the matrix was written but a run could not be made (timed out, crashed,
its program failed) or nothing was judged at all (no engine ran); 2 bad input (an unknown engine,
profile or --option, a selection of no case, an --out that is a file, someone else's folder or one
another run is writing, a --markdown/--html FILE inside a fixture suite or not made by this command).
Nothing is written outside --out and the files named by --markdown and --html."""


def _description() -> str:
    import textwrap

    from gdncheck.conformance.engines.registry import ENGINES

    names = ", ".join(n + (" (the baseline)" if e.baseline else "") for n, e in ENGINES.items())
    return DESCRIPTION.format(engines=textwrap.fill(f"The engines: {names}.", width=100))

MARKER = ".gdncheck-engines"
#: the default --timeout: the longest one engine may run in one profile (the whole matrix takes ~1 min here)
DEFAULT_TIMEOUT = 900.0
#: the most of an engine program's output kept (its last bytes: where it says why it stopped)
OUTPUT_TAIL = 64 * 1024
#: the longest --timeout (a day): past it no run is bounded any more (setitimer's range ends far before 1e308)
MAX_TIMEOUT = 86400.0
#: the shortest --timeout: below it the interval timer rounds to 0, which is no timer at all
MIN_TIMEOUT = 0.1
#: an engine program's output file: its first and last bytes, whatever it prints (program-output.txt)
PROGRAM_OUTPUT_HEAD = 256 * 1024
PROGRAM_OUTPUT_TAIL = 768 * 1024


def configure(p: argparse.ArgumentParser) -> None:
    from gdncheck.conformance.engines.registry import ENGINES
    from gdncheck.fixtures.manifest import DEFAULT_DIR

    p.description = _description()
    p.add_argument("--engine", action="append", metavar="NAME",
                   help=f"only this engine (repeatable; default: every registered one: {', '.join(ENGINES)})")
    p.add_argument("--profile", action="append", metavar="P",
                   help="only this profile (repeatable; default: every profile each engine supports)")
    p.add_argument("--out", default="engines-out",
                   help="folder for the outputs, summaries and matrix (default engines-out; new, empty, or an "
                        "earlier `gdncheck engines` folder, whose engine folders are replaced)")
    p.add_argument("--fixtures", default=str(DEFAULT_DIR), help=f"fixture folder (default {DEFAULT_DIR})")
    p.add_argument("--markdown", metavar="FILE",
                   help="also write the Markdown page here; a FILE holding the generated blocks' markers keeps "
                        "its other text (docs/engines.md)")
    p.add_argument("--html", metavar="FILE", help="also write the HTML view here")
    p.add_argument("--case", action="append", help="only this case (id or id prefix; repeatable)")
    p.add_argument("--tag", action="append", help="only cases with this tag (repeatable)")
    p.add_argument("--option", action="append", metavar="ENGINE:KEY=VALUE",
                   help="an --option for one engine's factory, over the registry's (e.g. fla:kernel=chunk)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                   help=f"the longest one engine may run in one profile, {MIN_TIMEOUT:g} to {MAX_TIMEOUT:.0f} (default "
                        f"{DEFAULT_TIMEOUT:.0f}); past it the run is stopped (a program with everything it started) "
                        "and is a run that could not be made (exit 1)")
    p.add_argument("--diagnose", type=int, default=8, metavar="N",
                   help="name the likely cause of the first N failing cases of each run, as verify does "
                        "(default 8; 0: none)")
    add_output_arguments(p)


def _check_out(out, fixtures):
    """--out: a new or empty folder, or an earlier matrix folder (its marker), never a file or a suite."""
    from pathlib import Path

    from gdncheck.errors import GDNError
    from gdncheck.fixtures.manifest import refuse_output_in_suite

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise GDNError(f"--out {out}: expected a folder for the matrix, found a file")
    if any(parent.exists() and not parent.is_dir() for parent in out.parents):
        raise GDNError(f"--out {out}: a parent of it is a file")
    if out.is_dir() and any(p.name != LOCK_NAME for p in out.iterdir()) and not (out / MARKER).is_file():
        raise GDNError(f"--out {out} is not empty and holds no earlier `gdncheck engines` run ({MARKER}): choose "
                       "another folder (the engine folders in it are replaced)")
    refuse_output_in_suite(out, fixtures)
    return out


#: the lock file gdncheck.untrusted.folder_lock keeps in --out while a matrix is written there
LOCK_NAME = ".gdncheck.lock"
#: the HTML view's title (reports/templates/engines.html.j2): a --html FILE without it is not one this command wrote
HTML_TITLE = "<title>gdncheck engines: cross-engine conformance matrix</title>"


def _check_page(path, flag: str):
    """--markdown / --html FILE: never inside a fixture suite (its manifest or goldens), and an existing
    FILE only one this command made (a Markdown page with its generated blocks' markers, once each and in
    order, whose other text is kept; an HTML view it wrote): anything else is someone's file."""
    from gdncheck.commands.run import output_file
    from gdncheck.errors import GDNError
    from gdncheck.fixtures.manifest import is_suite
    from gdncheck.reports import engines as pages

    path = output_file(path, flag)
    folder = path.resolve().parent
    suite = next((f for f in (folder, *folder.parents) if is_suite(f)), None)
    if suite is not None:
        raise GDNError(f"{flag} {path} lies in the fixture suite {suite}: a page never goes into one (it could replace "
                       "its manifest or a golden); choose a file elsewhere")
    if not path.exists():
        return path
    try:
        with open(path, "rb") as fh:
            text = fh.read(PAGE_MAX + 1).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GDNError(f"{flag} {path}: expected a page `gdncheck engines` wrote, found a file it cannot read as "
                       f"UTF-8 text ({type(exc).__name__}); it is never overwritten: choose another file") from None
    if len(text) > PAGE_MAX:
        raise GDNError(f"{flag} {path}: expected a page `gdncheck engines` wrote, found a file over "
                       f"{PAGE_MAX // 2**20} MB; it is never overwritten: choose another file")
    if flag == "--html":
        if HTML_TITLE not in text[:4096]:
            raise GDNError(f"{flag} {path} exists and is not an HTML view `gdncheck engines` wrote (its title is "
                           "not the view's): it is never overwritten; choose another file or remove it")
        return path
    problem = pages.marker_problem(text)
    if problem:
        raise GDNError(f"{flag} {path}: {problem}; it is never overwritten (its text would be lost): choose another "
                       "file, or put the two marker lines of docs/engines.md where the matrix goes")
    return path


#: the largest --markdown / --html FILE read to be replaced (docs/engines.md: ~60 KB)
PAGE_MAX = 16 * 2**20


def _engine_options(pairs, registry) -> dict:
    """--option ENGINE:KEY=VALUE, each checked against what the engine's factory takes (the registry's
    ``option_values``: its keys, and the values where it lists them)."""
    from gdncheck.conformance.ports.plugin import parse_options
    from gdncheck.errors import GDNError

    names = list(registry.ENGINES)
    out: dict[str, list[str]] = {}
    for pair in pairs or []:
        name, sep, rest = pair.partition(":")
        if not sep or name not in names:
            raise GDNError(f"expected --option ENGINE:KEY=VALUE with ENGINE one of {', '.join(names)}, found {pair!r}")
        out.setdefault(name, []).append(rest)
    parsed = {k: parse_options(v) for k, v in out.items()}
    for name, opts in parsed.items():
        known = registry.ENGINES[name].option_values
        for key, value in opts.items():
            if key not in known:
                takes = f"one of {', '.join(known)}" if known else "none"
                raise GDNError(f"expected --option {name}:KEY=VALUE with KEY {takes} (the options {name} takes), "
                               f"found {key!r}")
            if known[key] and value not in known[key]:
                raise GDNError(f"expected --option {name}:{key}= one of {', '.join(map(str, known[key]))}, "
                               f"found {value!r}")
    return parsed


def run(args: argparse.Namespace) -> int:
    """Every input checked, then each engine probed and run in each profile, then the matrix written."""
    import logging
    import time

    from gdncheck.env import limit_blas_threads
    from gdncheck.untrusted import folder_lock, safe_text

    started = time.perf_counter()
    limit_blas_threads()
    logging.getLogger("gdncheck").setLevel(logging.ERROR)  # the seq-len reset warning is part of the programs
    con = Console(args)
    names, options, fixtures, out, manifest, pages = _checked_inputs(args)  # bad input: exit 2, before anything runs
    if "fla" in names:
        _interpret_triton_without_gpu()
    with folder_lock(out, "--out"):  # one writer per matrix folder (a second run: exit 2 naming the first)
        _check_out(out, fixtures)  # again, under the lock: what was checked may have changed meanwhile
        (out / MARKER).write_text("written by gdncheck engines; the engine folders here are replaced by the next run\n")
        rows = [_engine_row(name, options, fixtures, out, args, con) for name in names]
        matrix = _matrix(args, fixtures, manifest, rows, started)
        _write(matrix, out, *pages)
    t = matrix["totals"]
    by = ", ".join(f"{n} {k}" for k, n in t["findings_by_class"].items() if n) or "none"
    con.say(safe_text(f"matrix: {len(rows)} engine(s), {t['runs']} run(s); findings: {by}; {t['unexplained']} "
                      f"unexplained; {matrix['seconds']:.0f} s; {out / 'matrix.json'}"))
    if t["unexplained"]:
        con.say(safe_text(f"note: {t['unexplained']} finding(s) no known finding explains: see {out / 'matrix.md'}"))
    if t["could_not_run"]:
        con.say(safe_text(f"exit 1: {t['could_not_run']} run(s) could not be made (timed out, crashed or refused): "
                          f"see {out / 'matrix.md'}"))
        return 1
    if not t["cases_judged"]:
        con.say(safe_text("exit 1: nothing was judged (no engine selected is installed here, or none ran a case): "
                          "the matrix holds no verdict"))
        return 1
    return 0


def _interpret_triton_without_gpu() -> None:
    """fla's default, its Triton kernels, run under Triton's interpreter where there is no GPU: which
    ``@triton.jit`` reads when triton is imported, so before any engine imports it
    (conformance/engines/fla/README.md)."""
    import os
    import sys

    if "triton" in sys.modules or "TRITON_INTERPRET" in os.environ:
        return
    try:
        import torch
    except ImportError:
        return
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def _checked_inputs(args):
    """(engine names in the registry's order, their --option values, the fixture folder, --out, the
    manifest, the --markdown and --html files or None), every one checked: an unknown engine or profile,
    a bad option, a folder, a selection of no case is a GDNError (exit 2)."""
    import math

    from gdncheck.commands.run import existing_folder
    from gdncheck.conformance.engines import registry
    from gdncheck.errors import GDNError
    from gdncheck.fixtures.manifest import load_manifest, select_cases
    from gdncheck.profiles import VERIFY_PROFILES

    for n in args.engine or []:
        registry.engine(n)  # an unknown name: exit 2
    names = [n for n in registry.ENGINES if not args.engine or n in args.engine]  # the registry's order
    for p in args.profile or []:
        if p not in VERIFY_PROFILES:
            raise GDNError(f"expected --profile one of {', '.join(VERIFY_PROFILES)}, found {p!r}")
    if not (math.isfinite(args.timeout) and MIN_TIMEOUT <= args.timeout <= MAX_TIMEOUT):
        raise GDNError(f"expected --timeout a number of seconds from {MIN_TIMEOUT:g} to {MAX_TIMEOUT:.0f}, found "
                       f"{args.timeout!r}")
    if args.diagnose < 0:
        raise GDNError(f"expected --diagnose N a count of cases (0: none), found {args.diagnose}")
    options = _engine_options(args.option, registry)
    fixtures = existing_folder(args.fixtures, "--fixtures", "a fixture folder")
    out = _check_out(args.out, fixtures)
    md_path = _check_page(args.markdown, "--markdown") if args.markdown else None
    html_path = _check_page(args.html, "--html") if args.html else None
    problems: list = []
    manifest = load_manifest(fixtures, problems)
    select_cases(manifest, args.case, args.tag, None, also_known=[p.case for p in problems])  # SelectionError: 2
    return names, options, fixtures, out, manifest, (md_path, html_path)


def _engine_row(name, options, fixtures, out, args, con) -> dict:
    """One engine's row of the matrix: what it is, whether it is installed, and its result per profile."""
    import shutil

    from gdncheck.conformance.engines import registry
    from gdncheck.conformance.engines.probe import probe
    from gdncheck.untrusted import safe_text

    eng = registry.ENGINES[name]
    pr = probe(eng)
    row = {"name": name, "impl": eng.spec(), "judged": eng.judged, "profiles": list(eng.profiles),
           "options": {**eng.options, **options.get(name, {})},
           "option_values": {k: list(v) for k, v in eng.option_values.items()}, "about": eng.about,
           "baseline": eng.baseline, "installed": pr.installed, "missing": pr.missing, "install": eng.install,
           "versions": pr.versions, "status": "ran", "problem": None, "profiles_run": [], "results": {}}
    if not pr.installed:
        row.update(status="not_installed", problem=pr.hint(eng))
        con.say(safe_text(f"{name}: {row['problem']}"))
        return row
    profiles = [p for p in eng.profiles if not args.profile or p in args.profile]
    if not profiles:
        row.update(status="no_profile", problem=f"none of the profiles asked for ({', '.join(args.profile)}) "
                                                f"is one it supports ({', '.join(eng.profiles)})")
        return row
    cases = _engine_cases(eng, fixtures, args)
    if cases == []:
        row.update(status="no_case", problem=f"none of the cases selected carries a tag it is judged on "
                                             f"({', '.join(eng.tags)})")
        con.say(safe_text(f"{name}: {row['problem']}"))
        return row
    engine_dir = out / name
    if engine_dir.exists():
        shutil.rmtree(engine_dir)
    for profile in profiles:
        row["profiles_run"].append(profile)
        row["results"][profile] = _run_one(eng, row["options"], profile, fixtures, engine_dir / profile, args, con,
                                           cases)
    return row


def _engine_cases(eng, fixtures, args) -> list[str] | None:
    """The ids of the cases an engine with ``tags`` (schema.Engine) is judged on, within --case / --tag; None
    for an engine judged on every case selected."""
    from gdncheck.errors import GDNError
    from gdncheck.fixtures.manifest import load_manifest, select_cases

    if not eng.tags:
        return None
    try:
        selected = select_cases(load_manifest(fixtures, []), args.case, args.tag)
    except GDNError:
        return None  # said by the run, as for any engine
    return [c["id"] for c in selected if set(eng.tags) & set(c.get("tags", []))]


def _matrix(args, fixtures, manifest, rows, started) -> dict:
    """The matrix document (matrix.json): the command, the suite, the selection, the rows, the totals."""
    import shlex
    import time

    from gdncheck._version import __version__
    from gdncheck.conformance.engines.matrix import CLASSES
    from gdncheck.fixtures.manifest import sha256_file

    words = ["gdncheck", "engines"] + [a for n in (args.engine or []) for a in ("--engine", n)] \
        + [a for p in (args.profile or []) for a in ("--profile", p)] \
        + [a for c in (args.case or []) for a in ("--case", c)] + [a for t in (args.tag or []) for a in ("--tag", t)] \
        + [a for o in (args.option or []) for a in ("--option", o)]
    matrix = {"schema": "gdncheck-engines-matrix", "schema_version": 1,
              "tool": {"name": "gdncheck", "version": __version__}, "command": shlex.join(words),
              "fixtures": {"dir": str(fixtures), "suite": manifest.get("suite", fixtures.name),
                           "manifest_sha256": sha256_file(fixtures / "manifest.json")},
              "selection": {"cases": args.case, "tags": args.tag},
              "classes": list(CLASSES), "engines": rows}
    matrix["totals"] = _totals(rows, CLASSES)
    matrix["seconds"] = round(time.perf_counter() - started, 1)
    return matrix


def _write(matrix: dict, out, md_path, html_path) -> None:
    """matrix.json, matrix.md and matrix.html in ``out``; --markdown (its header kept) and --html where asked."""
    import json

    from gdncheck.reports import engines as pages
    from gdncheck.safetensors_io import write_bytes_atomic

    write_bytes_atomic(out / "matrix.json", (json.dumps(matrix, indent=1) + "\n").encode())
    write_bytes_atomic(out / "matrix.md", pages.render_markdown(matrix, out).encode())
    write_bytes_atomic(out / "matrix.html", pages.render_html(matrix, out).encode())
    if md_path is not None:
        existing = md_path.read_text(encoding="utf-8") if md_path.is_file() else None
        write_bytes_atomic(md_path, pages.update_markdown(existing, matrix, md_path.parent).encode())
    if html_path is not None:
        write_bytes_atomic(html_path, pages.render_html(matrix, html_path.parent).encode())


class _Timeout(BaseException):
    """An in-process engine run past --timeout (raised by the alarm in the main thread; a BaseException, so
    that no adapter or harness `except Exception` takes it for the case's own error)."""


def _run_one(eng, opts, profile, fixtures, folder, args, con, cases: list[str] | None = None) -> dict:
    """One engine in one profile: run, verify, classify. An engine that cannot run (refused, timed out,
    its program failed) is a result saying why: a run that could not be made, never a pass."""
    import json
    import os
    import time

    from gdncheck.conformance.engines import matrix, registry
    from gdncheck.conformance.judge.verify import verify
    from gdncheck.conformance.ports.run import default_command, run_impl
    from gdncheck.errors import GDNError
    from gdncheck.safetensors_io import write_bytes_atomic
    from gdncheck.untrusted import one_line, safe_text

    t0 = time.perf_counter()
    spec = eng.spec()
    selection = {"cases": args.case, "tags": args.tag} if cases is None else {"cases": cases, "tags": None}
    try:
        if eng.command is not None:
            command = _run_program(eng, fixtures, folder, args, profile)
        else:
            command = default_command(spec, fixtures, folder, profile, opts, eng.stage_isolated)
            with _alarm(args.timeout, f"{eng.name} {profile}"):
                run_impl(spec, fixtures, folder, profile, **selection, options=opts,
                         stage_isolated=eng.stage_isolated, command=command)
        diagnose = None
        if args.diagnose > 0:
            from gdncheck.conformance.meta.catalogue import mutant_diagnoser

            diagnose = mutant_diagnoser(fixtures, limit=args.diagnose)
        if eng.judge is not None:  # a whole engine: its own judge reads what its program captured
            from gdncheck.fixtures.manifest import load_manifest, select_cases

            if selection["tags"]:
                ids = [e["id"] for e in select_cases(load_manifest(fixtures, []), selection["cases"],
                                                     selection["tags"], None)]
            else:
                ids = list(selection["cases"] or [])
            summary = _own_judge(eng)(fixtures, folder, profile, cases=ids)
        else:
            summary = verify(fixtures, folder, profile, **selection,
                             stage_isolated=eng.stage_isolated, fused=eng.fused, diagnose=diagnose)
    except (GDNError, _Timeout) as exc:
        con.say(safe_text(f"{eng.name} {profile}: could not run: {one_line(exc)}"))
        return {"status": "could_not_run", "problem": one_line(exc), "seconds": round(time.perf_counter() - t0, 1)}
    except Exception as exc:  # noqa: BLE001 - one engine never stops the matrix (GDN_DEBUG=1 raises)
        if os.environ.get("GDN_DEBUG"):
            raise
        text = f"internal error: {type(exc).__name__}: {one_line(exc)} (rerun with GDN_DEBUG=1 for the traceback)"
        con.say(safe_text(f"{eng.name} {profile}: could not run: {text}"))
        return {"status": "could_not_run", "problem": text, "seconds": round(time.perf_counter() - t0, 1)}
    doc = summary.to_json()
    path = folder / f"verify-summary-{profile}.json"
    write_bytes_atomic(path, (json.dumps(doc, indent=1) + "\n").encode())
    result = matrix.profile_result(doc, eng.name, profile, registry.FINDINGS)
    result.update(summary=str(path), outputs=str(folder), run_command=command,
                  seconds=round(time.perf_counter() - t0, 1))
    c = result["counts"]
    by = ", ".join(f"{n} {k}" for k, n in result["findings_by_class"].items() if n) or "none"
    con.progress(safe_text(f"{eng.name} {profile}: {c['pass']} pass, {c['fail']} fail, {c['not_applicable']} n/a of "
                           f"{c['cases']}; findings: {by}" + (f"; {result['unexplained']} UNEXPLAINED"
                                                             if result["unexplained"] else "")
                           + f" ({result['seconds']:.1f} s)"))
    for f in result["findings"]:
        if f["unexplained"]:
            con.say(safe_text(f"  unexplained {f['class']}: {f['case']}: {f.get('mismatch') or f.get('detail')}"))
    return result


def _own_judge(eng):
    """The judge an engine's entry names (``module:function`` inside gdncheck's engines package)."""
    import importlib

    from gdncheck.errors import GDNError

    module, _, name = eng.judge.partition(":")
    if not module.startswith("gdncheck.conformance.engines.") or not name:
        raise GDNError(f"expected {eng.name}'s judge to be a function of its folder (module:function), found "
                       f"{eng.judge!r}")
    return getattr(importlib.import_module(module), name)


class _alarm:
    """Raise :class:`_Timeout` in the main thread after ``seconds`` (SIGALRM, where there is one and this is
    the main thread; elsewhere nothing is bounded). An engine stuck inside native code that never returns to
    Python is stopped when it does."""

    def __init__(self, seconds: float, what: str):
        self.seconds, self.what, self.old = seconds, what, None

    def _fire(self, *_):
        raise _Timeout(f"{self.what} ran past --timeout {self.seconds:g} s and was stopped")

    def __enter__(self):
        import signal
        import threading

        if hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc):
        import signal

        if self.old is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.old)
        return False


def _run_program(eng, fixtures, folder, args, profile: str) -> str:
    """Run an engine that has a program of its own (``eng.command``) into ``folder``; its command line.
    Its exit 0, or 2 (a case it could not read or run: no outputs file, which verify reports), lets the
    matrix judge what it wrote -- unless it wrote no outputs file at all; any other exit (3: no WebGPU
    adapter), a run past --timeout, is a run that could not be made. It runs in a session of its own, and
    whatever it started is killed with it when it ends (a background child never outlives the run). Its
    output goes to a file of its folder (``program-output.txt``: its first and last bytes, the middle left out
    and said so), never into memory, whatever its size or encoding; its last line is quoted."""
    import shlex
    import subprocess
    from pathlib import Path

    from gdncheck.errors import GDNError
    from gdncheck.fixtures.manifest import load_manifest, select_cases
    from gdncheck.untrusted import one_line

    glue = eng.glue_folder()
    fill = {"{folder}": str(glue), "{fixtures}": str(Path(fixtures).resolve()), "{out}": str(Path(folder).resolve()),
            "{profile}": profile}
    argv = []
    for word in eng.command:
        for key, value in fill.items():
            word = word.replace(key, value)
        argv.append(word)
    # the program selects by case id prefix: a tag selection goes to it as the ids it selects
    ids = [e["id"] for e in select_cases(load_manifest(fixtures, []), args.case, args.tag, None)] if args.tag \
        else list(args.case or [])
    argv += [w for c in ids for w in ("--case", c)]
    Path(folder).mkdir(parents=True, exist_ok=True)
    log = Path(folder) / "program-output.txt"
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
    except OSError as exc:
        raise GDNError(f"{eng.name}: {shlex.join(argv[:2])} could not run: {one_line(exc)}") from None
    keeper = _BoundedOutput(proc.stdout, log)
    keeper.start()
    try:
        ended = _wait_unreaped(proc, args.timeout)
    finally:
        code = _kill_group(proc)  # whatever it started, on its timeout and when it ends alike
        keeper.finish()
    if not ended:
        raise GDNError(f"{eng.name}: {shlex.join(argv[:2])} ran past --timeout {args.timeout:g} s and was "
                       f"stopped (its output: {log})")
    if code not in (0, 2):
        said = _last_line(log)
        how = f"was killed by signal {-code}" if code < 0 else f"exited {code}"
        raise GDNError(f"{eng.name}: {shlex.join(argv[:2])} {how}" + (f": {one_line(said)}" if said else ""))
    if not any(p.suffix == ".safetensors" for p in Path(folder).iterdir()):
        said = _last_line(log)
        raise GDNError(f"{eng.name}: {shlex.join(argv[:2])} exited {code} having written no outputs file into "
                       f"{folder}" + (f": {one_line(said)}" if said else " (it printed nothing)"))
    return shlex.join(argv)


class _BoundedOutput:
    """Drains a program's output pipe into ``path`` as it comes (the program never blocks on a full pipe):
    its first :data:`PROGRAM_OUTPUT_HEAD` bytes written at once, its last :data:`PROGRAM_OUTPUT_TAIL` bytes
    kept in memory and written at the end after a line saying how many bytes were left out between."""

    def __init__(self, pipe, path):
        import threading

        self.pipe, self.path, self.stop = pipe, path, threading.Event()
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.head_left, self.tail, self.dropped = PROGRAM_OUTPUT_HEAD, bytearray(), 0

    def start(self) -> None:
        self.fh = open(self.path, "wb")  # noqa: SIM115 - closed by finish
        self.thread.start()

    def _drain(self) -> None:
        try:
            self._read_all()
        except (OSError, ValueError):  # the pipe or file closed under it: what was read is kept
            pass

    def _read_all(self) -> None:
        import os
        import select
        import time

        fd, stopped = self.pipe.fileno(), None
        while True:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if self.stop.is_set():
                stopped = stopped or time.monotonic()
                # the group is killed: what is left in the pipe is read, a writer that escaped the group (a
                # session of its own) and keeps writing is not waited for past 2 s
                if not ready or time.monotonic() - stopped > 2.0:
                    return
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return
            if self.head_left:
                part, chunk = chunk[:self.head_left], chunk[self.head_left:]
                self.fh.write(part)
                self.head_left -= len(part)
            self.tail += chunk
            if len(self.tail) > PROGRAM_OUTPUT_TAIL:
                cut = len(self.tail) - PROGRAM_OUTPUT_TAIL
                self.dropped += cut
                del self.tail[:cut]

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        if self.dropped:
            self.fh.write(f"\n[gdncheck: {self.dropped} bytes of the program's output left out here: the file keeps "
                          f"its first {PROGRAM_OUTPUT_HEAD} and last {PROGRAM_OUTPUT_TAIL} bytes]\n".encode())
        self.fh.write(bytes(self.tail))
        self.fh.close()
        self.pipe.close()


def _wait_unreaped(proc, timeout: float) -> bool:
    """Whether ``proc`` ended within ``timeout`` seconds, leaving it unreaped (its process id, which is its
    group's, stays taken until :func:`_kill_group` has killed the group)."""
    import os
    import subprocess
    import time

    if not hasattr(os, "waitid"):
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    deadline = time.monotonic() + timeout
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _kill_group(proc) -> int:
    """Stop whatever a program started (its own session, its process group) and the program, reap it; its
    exit status."""
    import os
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (OSError, AttributeError):
        if proc.poll() is None:
            proc.kill()
    return proc.wait()


def _last_line(path) -> str:
    """The last non-blank line of a program's output file, from its last :data:`OUTPUT_TAIL` bytes, decoded
    with replacement (an engine may print anything)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - OUTPUT_TAIL))
            tail = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    lines = [line for line in tail.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _totals(rows, classes) -> dict:
    results = [r for row in rows for r in row["results"].values() if r["status"] == "ran"]
    return {"engines": len(rows), "installed": sum(r["installed"] for r in rows), "runs": len(results),
            "could_not_run": sum(r["status"] != "ran" for row in rows for r in row["results"].values()),
            "tensors_judged": sum(int(r.get("tensors_judged") or 0) for r in results),
            # judged: passed or failed (not applicable, unusable: no verdict on the engine)
            "cases_judged": sum(r["counts"]["pass"] + r["counts"]["fail"] for r in results),
            "findings_by_class": {k: sum(r["findings_by_class"][k] for r in results) for k in classes},
            "unexplained": sum(r["unexplained"] for r in results)}
