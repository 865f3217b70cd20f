"""One GPU check, one result: versions, the GPU tests, the compile table and the benchmark, written
as ``gpu-check.json`` and ``gpu-check.md`` (scripts/gpu_check.sh runs it).

    python -m gdncheck.gpu_tools.gpu_check --out DIR [--dry-run] [--full-compile] [-- PYTEST ARGS]

Each step runs in its own process with a time limit, so that one that hangs or crashes still
leaves the others' results in the file. ``--dry-run`` takes the same steps on the CPU at tiny
sizes (CI runs it): one layer test and one serving test in the interpreter, the compile table of a
tiny layer (and its serving calls), the benchmark's dry run. The result's ``status`` is ``pass``
when the tests pass, the compile table has no problem and the benchmark ran.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from gdncheck.untrusted import OneLineParser

#: time limits (s) of the steps on a GPU; the dry run has its own
LIMITS = {"tests": 300, "compile": 420, "bench": 240}
DRY_LIMITS = {"tests": 240, "compile": 240, "bench": 300}

DRY_TESTS = ["tests/gpu_impl/test_layer.py", "tests/gpu_impl/test_serving.py", "tests/gpu_impl/test_large_index.py",
             "-k", "(test_segments_against_reference and Hk2_Hv4_dk16_dv8-f32) or "
             "(test_decode_batch_with_slot_indices and f32) or large_index",
             "-p", "no:xdist"]

_VERSIONS = """
import json, platform, sys
out = {"python": sys.version.split()[0], "platform": platform.platform()}
for name in ("torch", "triton", "numpy", "fla", "gdncheck"):
    try:
        module = __import__(name)
        out[name] = getattr(module, "__version__", "imported")
    except Exception as exc:
        out[name] = f"not importable ({type(exc).__name__})"
import torch
out["cuda_device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
out["cuda_runtime"] = torch.version.cuda
print(json.dumps(out))
"""


def _run(cmd: list[str], limit: int, cwd: str | None = None) -> dict:
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, cwd=cwd)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = 124, (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else \
            (exc.stdout or ""), f"timed out after {limit} s"
    return {"rc": rc, "seconds": round(time.monotonic() - t0, 1), "stdout": out, "stderr": err}


def versions(py: str) -> dict:
    run = _run([py, "-c", _VERSIONS], 120)
    try:
        return json.loads(run["stdout"].strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": run["stderr"][-500:]}


def tests(py: str, pytest_args: list[str], limit: int, workdir: Path, cwd: str | None) -> dict:
    junit = workdir / "tests.xml"
    run = _run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *pytest_args], limit,
               cwd=cwd)
    result = {"rc": run["rc"], "seconds": run["seconds"], "tail": run["stdout"][-3000:] + run["stderr"][-1000:]}
    if junit.exists():
        suites = ET.parse(junit).getroot()
        suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
        n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        n["passed"] = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
        result.update(n)
        result["failed"] = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
                            if c.find("failure") is not None or c.find("error") is not None][:50]
        # figures the tests record (record_property), by test
        result["properties"] = {f"{c.get('classname')}::{c.get('name')}": {q.get("name"): q.get("value")
                                for q in c.iter("property")} for c in suite.iter("testcase")
                                if c.find("properties") is not None}
        # why each failed, in a line: what a person fixing it on a machine without a GPU needs first
        result["why"] = {f"{c.get('classname')}::{c.get('name')}": _why(c) for c in suite.iter("testcase")
                         if c.find("failure") is not None or c.find("error") is not None}
    return result


def _why(case: ET.Element) -> str:
    """The failure's message, else the last line of its traceback that names an error, 400 characters."""
    node = case.find("failure") if case.find("failure") is not None else case.find("error")
    text = (node.get("message") or "").strip()
    if not text:
        lines = [ln for ln in (node.text or "").splitlines() if ln.startswith("E ")]
        text = lines[-1] if lines else (node.text or "").strip().splitlines()[-1:][0] if node.text else ""
    return " ".join(text.split())[:400]


def compile_table(py: str, scope: str, limit: int, workdir: Path, cwd: str | None) -> dict:
    path = workdir / "compile.json"
    run = _run([py, "-m", "gdncheck.gpu_tools.compile_check", f"--{scope}", "--json", str(path)], limit, cwd=cwd)
    result = json.loads(path.read_text()) if path.exists() else {"builds": [], "problems": []}
    result.update(rc=run["rc"], seconds=run["seconds"], scope=scope)
    if run["rc"] not in (0, 1):
        result["error"] = (run["stderr"] or run["stdout"])[-2000:]
    return result


def bench(py: str, dry_run: bool, limit: int, workdir: Path, cwd: str | None) -> dict:
    path = workdir / "bench.json"
    run = _run([py, "-m", "gdncheck.gpu_tools.bench", "--json", str(path), *(["--dry-run"] if dry_run else [])],
               limit, cwd=cwd)
    result = json.loads(path.read_text()) if path.exists() else {}
    result.update(rc=run["rc"], seconds=run["seconds"])
    if run["rc"] != 0:
        result["error"] = (run["stderr"] or run["stdout"])[-2000:]
    return result


def status(result: dict) -> str:
    t, c, b = result["tests"], result["compile"], result["bench"]
    ok = t.get("rc") == 0 and t.get("tests", 0) > 0 and c.get("rc") == 0 and not c.get("problems") and \
        b.get("rc") == 0
    return "pass" if ok else "fail"


def markdown(result: dict) -> str:
    from .bench import markdown as bench_markdown
    from .compile_check import markdown as compile_markdown

    v, t, c, b = result["versions"], result["tests"], result["compile"], result["bench"]
    lines = [f"# gdncheck GPU check: {result['status'].upper()} ({result['mode']})", "",
             "| found | version |", "|---|---|"]
    lines += [f"| {k} | {val} |" for k, val in v.items()]
    lines += ["", f"## Tests ({t.get('seconds', '?')} s)", ""]
    if "tests" in t:
        lines.append(f"{t['passed']} passed, {t['failures']} failed, {t['errors']} errors, {t['skipped']} skipped "
                     f"(exit {t['rc']}).")
        lines += [f"- figures of `{name}`: " + ", ".join(f"{k} = {v}" for k, v in props.items())
                  for name, props in t.get("properties", {}).items()]
        why = t.get("why", {})
        lines += [f"- failed: `{name}`" + (f": {why[name]}" if why.get(name) else "") for name in t.get("failed", [])]
    else:
        lines += [f"No test report (exit {t.get('rc')}):", "", "```", t.get("tail", "")[-1500:], "```"]
    lines += ["", f"## Compile table ({c.get('scope')}, {c.get('seconds', '?')} s)", ""]
    lines.append(compile_markdown(c) if c.get("builds") else f"No table (exit {c.get('rc')}): "
                 f"{c.get('error', '')[-800:]}")
    lines += ["", f"## Benchmark ({b.get('seconds', '?')} s)", ""]
    lines.append(bench_markdown(b) if "decode" in b else f"No benchmark (exit {b.get('rc')}): {b.get('error', '')}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = OneLineParser(prog="python -m gdncheck.gpu_tools.gpu_check", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for gpu-check.json and gpu-check.md")
    p.add_argument("--dry-run", action="store_true", help="the same steps on the CPU at tiny sizes")
    p.add_argument("--full-compile", action="store_true", help="the full compile plan (default: --quick on a GPU)")
    p.add_argument("--cwd", help="folder to run the steps from (default: the current one)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    py, limits = sys.executable, DRY_LIMITS if args.dry_run else LIMITS
    scope = "tiny" if args.dry_run else "full" if args.full_compile else "quick"
    result = {"mode": "dry run on the CPU" if args.dry_run else "GPU", "started": time.strftime("%Y-%m-%d %H:%M:%S"),
              "host": platform.node(), "versions": versions(py)}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        default_tests = DRY_TESTS if args.dry_run else ["tests/gpu_impl", "tests/gpu_tools"]
        steps = (("tests", lambda: tests(py, pytest_args or default_tests, limits["tests"], work, args.cwd)),
                 ("compile", lambda: compile_table(py, scope, limits["compile"], work, args.cwd)),
                 ("bench", lambda: bench(py, args.dry_run, limits["bench"], work, args.cwd)))
        for name, step in steps:
            print(f"gpu_check: {name} ...", flush=True)
            result[name] = step()
            print(f"gpu_check: {name} done in {result[name].get('seconds')} s (exit {result[name].get('rc')})",
                  flush=True)
            # what is done so far survives a run cut off by its caller's limit
            (out / "gpu-check.partial.json").write_text(json.dumps(result, indent=1, default=str))
    result["status"] = status(result)
    (out / "gpu-check.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "gpu-check.md").write_text(markdown(result))
    (out / "gpu-check.partial.json").unlink(missing_ok=True)
    print(f"gpu_check: {result['status'].upper()}: {out / 'gpu-check.json'}, {out / 'gpu-check.md'}")
    return 0 if result["status"] == "pass" else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
