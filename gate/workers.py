"""The gate's units of work, run in worker processes (or in-process with one job).

A unit is one case in one profile (``run_impl`` over that case, writing its outputs file) or one
property in one profile (:func:`~gdncheck.conformance.properties.runner.run_property`). Workers are
spawned (not forked: torch and Triton threads do not survive a fork), each with one BLAS and one
torch thread, so two workers use two cores.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path

from gdncheck.conformance.ports.run import run_impl
from gdncheck.conformance.properties.registry import subject_from_env
from gdncheck.conformance.properties.runner import run_property
from gdncheck.env import limit_blas_threads
from gdncheck.errors import GDNError
from gdncheck.fixtures.build import check_suite
from gdncheck.untrusted import safe_text

from .plan import CaseUnit, PropertyUnit


def init_worker(env: dict[str, str]) -> None:
    os.environ.update(env)
    limit_blas_threads(1)
    logging.getLogger("gdncheck").setLevel(logging.ERROR)  # seq-len resets are part of the programs
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:  # a plug-in environment without torch
        pass


def run_case_unit(impl: str, fixtures: str, out: str, unit: CaseUnit, options: dict, command: str) -> dict:
    """One case in one profile. Whatever happens here is this case's result: a run that cannot finish
    (an exception outside the implementation's calls, which ``run_impl`` records itself) writes no
    outputs file, so verify reports the case unusable; the other units run on."""
    start = time.perf_counter()
    try:
        rep = run_impl(impl, fixtures, Path(out) / unit.profile, unit.profile, cases=[unit.case], options=options,
                       command=command)
        runs = [c for c in rep.cases if c.id == unit.case]
        status, detail = (runs[0].status, runs[0].detail) if runs else ("skipped", "not selected by run_impl")
    except Exception as exc:  # noqa: BLE001 - one case never stops the others
        if os.environ.get("GDN_DEBUG"):
            raise
        status, detail = "crashed", safe_text(f"{type(exc).__name__}: {exc}")
    return {"kind": "case", "case": unit.case, "profile": unit.profile, "status": status, "detail": detail,
            "seconds": time.perf_counter() - start}


def run_property_unit(impl: str, unit: PropertyUnit, max_examples: int | None, hypothesis_profile: str,
                      shrink: bool) -> dict:
    r = run_property(unit.name, subject_from_env(impl, unit.profile), max_examples=max_examples,
                     hypothesis_profile=hypothesis_profile, shrink=shrink)
    return {"kind": "property", **r.to_json()}


def run_rebuild_unit(fixtures: str, ids: list[str]) -> dict:
    """The fixture check's rebuild of some cases (``gdncheck fixtures check``'s, :func:`check_suite`): one
    report row per case; ``error`` when the suite cannot be rebuilt at all."""
    start = time.perf_counter()
    try:
        report, error = check_suite(fixtures, cases=ids), None
    except GDNError as exc:
        report, error = [], safe_text(str(exc))
    except Exception as exc:  # noqa: BLE001 - the gate says it could not check, never passes unchecked
        if os.environ.get("GDN_DEBUG"):
            raise
        report, error = [], safe_text(f"the rebuild crashed: {type(exc).__name__}: {exc}")
    return {"kind": "rebuild", "report": report, "error": error, "seconds": time.perf_counter() - start}


Task = tuple[Callable[..., dict], tuple, float]  # (function, arguments, cost)


def execute_tasks(tasks: list[Task], jobs: int, env: dict[str, str], first: list[Task] = ()) \
        -> Iterator[tuple[float, dict]]:
    """Run ``first`` in its order, then ``tasks``, most expensive first; yield ``(cost, result)`` as
    each one finishes."""
    tasks = list(first) + sorted(tasks, key=lambda t: -t[2])
    if jobs <= 1:
        saved = {k: os.environ.get(k) for k in env}
        init_worker(env)
        try:
            for fn, args, cost in tasks:
                yield cost, fn(*args)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"), initializer=init_worker,
                             initargs=(env,)) as pool:
        pending = {pool.submit(fn, *args): cost for fn, args, cost in tasks}
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    yield pending.pop(f), f.result()
        finally:
            for f in pending:
                f.cancel()
