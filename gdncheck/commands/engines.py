"""``gdncheck engines``: the cross-engine conformance matrix (docs/engines.md)."""

from __future__ import annotations

import argparse

from .console import Console, add_output_arguments

DESCRIPTION = """\
Run every installed engine of the registry (conformance/ports/engines.py: hf, mlx, fla, and the
reference as the baseline), or those named with --engine, in every profile it supports, through
`gdncheck run` and `gdncheck verify` (with the likely-cause diagnosis verify's command line gives),
into OUT/<engine>/<profile>/, then write the matrix: OUT/matrix.json, OUT/matrix.md and
OUT/matrix.html (and --markdown FILE, --html FILE).

Each engine's row: its versions, how it is judged (end-to-end: its whole layer and state; stage-
isolated: each stage it has, run alone from golden inputs), per profile the pass / fail / n/a
counts, the worst ratio error / bound over passing tensors, and every case that is no clean pass,
classified from verify's summary: deviation (with its float64 adjudication: stage, tensor, error /
bound), convention (declared, e.g. a routing tie), missing_feature (not applicable, with the reason),
engine_crash (the engine raised something that is no FORMAT.md §6 code), unusable. Known findings
add an explanation and a standalone repro script; a failing case no known finding explains is
marked unexplained. An engine that is not installed is a row saying how to install it.

Exit status: 0 the matrix was written (findings are its content, not a failure); 2 bad input (an
unknown engine or profile, a selection of no case, an --out that is a file or someone else's
folder). Nothing is written outside --out and the files named by --markdown and --html."""

MARKER = ".gdncheck-engines"


def configure(p: argparse.ArgumentParser) -> None:
    from gdncheck.conformance.ports.engines import ENGINES
    from gdncheck.fixtures.manifest import DEFAULT_DIR

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
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise GDNError(f"--out {out} is not empty and holds no earlier `gdncheck engines` run ({MARKER}): choose "
                       "another folder (the engine folders in it are replaced)")
    refuse_output_in_suite(out, fixtures)
    return out


def _engine_options(pairs, names):
    from gdncheck.conformance.ports.plugin import parse_options
    from gdncheck.errors import GDNError

    out: dict[str, list[str]] = {}
    for pair in pairs or []:
        name, sep, rest = pair.partition(":")
        if not sep or name not in names:
            raise GDNError(f"expected --option ENGINE:KEY=VALUE with ENGINE one of {', '.join(names)}, found {pair!r}")
        out.setdefault(name, []).append(rest)
    return {k: parse_options(v) for k, v in out.items()}


def run(args: argparse.Namespace) -> int:
    """Every input checked, then each engine probed and run in each profile, then the matrix written."""
    import logging
    import time

    from gdncheck.env import limit_blas_threads

    started = time.perf_counter()
    limit_blas_threads()
    logging.getLogger("gdncheck").setLevel(logging.ERROR)  # the seq-len reset warning is part of the programs
    con = Console(args)
    names, options, fixtures, out, manifest, pages = _checked_inputs(args)  # bad input: exit 2, before anything runs
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by gdncheck engines; the engine folders here are replaced by the next run\n")
    rows = [_engine_row(name, options, fixtures, out, args, con) for name in names]
    matrix = _matrix(args, fixtures, manifest, rows, started)
    _write(matrix, out, *pages)
    t = matrix["totals"]
    by = ", ".join(f"{n} {k}" for k, n in t["findings_by_class"].items() if n) or "none"
    from gdncheck.untrusted import safe_text

    con.say(safe_text(f"matrix: {len(rows)} engine(s), {t['runs']} run(s); findings: {by}; {t['unexplained']} "
                      f"unexplained; {matrix['seconds']:.0f} s; {out / 'matrix.json'}"))
    if t["unexplained"]:
        con.say(safe_text(f"note: {t['unexplained']} finding(s) no known finding explains: see {out / 'matrix.md'}"))
    return 0


def _checked_inputs(args):
    """(engine names in the registry's order, their --option values, the fixture folder, --out, the
    manifest, the --markdown and --html files or None), every one checked: an unknown engine or profile,
    a bad option, a folder, a selection of no case is a GDNError (exit 2)."""
    from gdncheck.commands.run import existing_folder, output_file
    from gdncheck.conformance.ports import engines as registry
    from gdncheck.errors import GDNError
    from gdncheck.fixtures.manifest import load_manifest, select_cases
    from gdncheck.profiles import VERIFY_PROFILES

    for n in args.engine or []:
        registry.engine(n)  # an unknown name: exit 2
    names = [n for n in registry.ENGINES if not args.engine or n in args.engine]  # the registry's order
    for p in args.profile or []:
        if p not in VERIFY_PROFILES:
            raise GDNError(f"expected --profile one of {', '.join(VERIFY_PROFILES)}, found {p!r}")
    options = _engine_options(args.option, list(registry.ENGINES))
    fixtures = existing_folder(args.fixtures, "--fixtures", "a fixture folder")
    out = _check_out(args.out, fixtures)
    md_path = output_file(args.markdown, "--markdown") if args.markdown else None
    html_path = output_file(args.html, "--html") if args.html else None
    problems: list = []
    manifest = load_manifest(fixtures, problems)
    select_cases(manifest, args.case, args.tag, None, also_known=[p.case for p in problems])  # SelectionError: 2
    return names, options, fixtures, out, manifest, (md_path, html_path)


def _engine_row(name, options, fixtures, out, args, con) -> dict:
    """One engine's row of the matrix: what it is, whether it is installed, and its result per profile."""
    import shutil

    from gdncheck.conformance.ports import engines as registry
    from gdncheck.untrusted import safe_text

    eng = registry.ENGINES[name]
    pr = registry.probe(eng)
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
    engine_dir = out / name
    if engine_dir.exists():
        shutil.rmtree(engine_dir)
    for profile in profiles:
        row["profiles_run"].append(profile)
        row["results"][profile] = _run_one(eng, row["options"], profile, fixtures, engine_dir / profile, args, con)
    return row


def _matrix(args, fixtures, manifest, rows, started) -> dict:
    """The matrix document (matrix.json): the command, the suite, the selection, the rows, the totals."""
    import shlex
    import time

    from gdncheck._version import __version__
    from gdncheck.conformance.ports import engines as registry
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
              "classes": list(registry.CLASSES), "engines": rows}
    matrix["totals"] = _totals(rows, registry.CLASSES)
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


def _run_one(eng, opts, profile, fixtures, folder, args, con) -> dict:
    """One engine in one profile: run, verify, classify. An engine that cannot run is a result saying why."""
    import json
    import os
    import time

    from gdncheck.conformance.judge.verify import verify
    from gdncheck.conformance.ports import engines as registry
    from gdncheck.conformance.ports.run import default_command, run_impl
    from gdncheck.errors import GDNError
    from gdncheck.safetensors_io import write_bytes_atomic
    from gdncheck.untrusted import one_line, safe_text

    t0 = time.perf_counter()
    spec = eng.spec()
    try:
        if eng.command is not None:
            command = _run_program(eng, fixtures, folder, args)
        else:
            command = default_command(spec, fixtures, folder, profile, opts, eng.stage_isolated)
            run_impl(spec, fixtures, folder, profile, cases=args.case, tags=args.tag, options=opts,
                     stage_isolated=eng.stage_isolated, command=command)
        diagnose = None
        if args.diagnose > 0:
            from gdncheck.conformance.meta.catalogue import mutant_diagnoser

            diagnose = mutant_diagnoser(fixtures, limit=args.diagnose)
        summary = verify(fixtures, folder, profile, cases=args.case, tags=args.tag,
                         stage_isolated=eng.stage_isolated, fused=eng.fused, diagnose=diagnose)
    except GDNError as exc:
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
    result = registry.profile_result(doc, eng.name, profile)
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


#: how long an engine's own program may run over the suite (doppler: ~6 s here)
PROGRAM_TIMEOUT = 1800


def _run_program(eng, fixtures, folder, args) -> str:
    """Run an engine that has a program of its own (``eng.command``) into ``folder``; its command line.
    Its exit 0, or 2 (a case it could not read or run: no outputs file, which verify reports), lets the
    matrix judge what it wrote; any other exit (3: no WebGPU adapter) is a run that could not be made."""
    import shlex
    import subprocess
    from pathlib import Path

    from gdncheck.errors import GDNError
    from gdncheck.fixtures.manifest import load_manifest, select_cases
    from gdncheck.untrusted import one_line

    glue = eng.glue_folder()
    fill = {"{folder}": str(glue), "{fixtures}": str(Path(fixtures).resolve()), "{out}": str(Path(folder).resolve())}
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
    try:
        run = subprocess.run(argv, capture_output=True, text=True, timeout=PROGRAM_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GDNError(f"{eng.name}: {shlex.join(argv[:2])} could not run: {one_line(exc)}") from None
    if run.returncode not in (0, 2):
        said = (run.stdout + run.stderr).strip().splitlines()
        raise GDNError(f"{eng.name}: {shlex.join(argv[:2])} exited {run.returncode}"
                       + (f": {one_line(said[-1])}" if said else ""))
    return shlex.join(argv)


def _totals(rows, classes) -> dict:
    results = [r for row in rows for r in row["results"].values() if r["status"] == "ran"]
    return {"engines": len(rows), "installed": sum(r["installed"] for r in rows), "runs": len(results),
            "could_not_run": sum(r["status"] != "ran" for row in rows for r in row["results"].values()),
            "findings_by_class": {k: sum(r["findings_by_class"][k] for r in results) for k in classes},
            "unexplained": sum(r["unexplained"] for r in results)}
