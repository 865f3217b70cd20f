"""What an engine's folder declares: its registry entry (:class:`Engine`) and its known findings
(:class:`Finding`, with :class:`Allow` for the failing tensors a finding accounts for).

Data only: each ``conformance/engines/<name>/engine.py`` builds one ``ENGINE = Engine(name=..., ...)`` and a
``FINDINGS = (Finding(case=..., profile=..., ...), ...)`` tuple with keyword fields; the registry
(:mod:`.registry`) finds the folders, and the matrix (:mod:`.matrix`) judges a verify summary with them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JUDGED = ("end_to_end", "stage_isolated", "fused")


@dataclass(frozen=True)
class Engine:
    """One engine of the matrix: what gdncheck runs (a built-in, a plug-in, or a program of its own:
    ``command``), how it is judged (``end_to_end``, ``stage_isolated`` or ``fused``), its profiles and
    ``--option`` values, what it needs (modules probed with :func:`importlib.util.find_spec`, which imports
    nothing of it; programs; files of its glue folder) with the line that installs it, and the packages whose
    versions the matrix reports (:func:`.probe.probe`)."""

    name: str
    impl: str  # the implementation spec gdncheck runs: a built-in name ...
    judged: str  # end_to_end | stage_isolated | fused (stage-isolated outputs, end-to-end bounds: a fused kernel)
    profiles: tuple[str, ...]
    modules: tuple[str, ...]  # top-level modules it needs (find_spec: nothing of the engine is imported)
    packages: tuple[str, ...]  # distributions whose versions are reported
    install: str | None  # the pip line that installs it (None: always there)
    about: str
    fallback: str | None = None  # ... or the plug-in it stands for while ``impl`` is no built-in
    options: Mapping[str, Any] = field(default_factory=dict)  # the --option values it runs with
    option_values: Mapping[str, tuple] = field(default_factory=dict)  # the options it takes, and their values
    baseline: bool = False
    #: an engine run by a program of its own (not through ``gdncheck run``): its argv, with ``{folder}``
    #: (:meth:`glue_folder`), ``{fixtures}``, ``{out}`` and ``{profile}`` filled in and ``--case ID`` appended
    command: tuple[str, ...] | None = None
    folder: str | None = None  # where its glue lives in a gdncheck checkout (or $GDN_<NAME>_DIR)
    needs: tuple[str, ...] = ()  # files of that folder it needs (its installed packages)
    programs: tuple[str, ...] = ()  # executables it needs on PATH
    npm_packages: tuple[str, ...] = ()  # npm packages of that folder whose versions are reported
    #: the cases its row is judged on, by tag (any of them; () every case): an engine that runs one part of
    #: the suite alone (fla-cp, context parallelism only: the sharded cases) is judged on that part, within
    #: the user's --case / --tag; none of them selected is a row that says so, not a run
    tags: tuple[str, ...] = ()
    #: a whole engine that cannot be fed the goldens' inputs (its program captures what it computed from its
    #: own inputs): ``"module:function"`` of its folder, ``function(fixtures, out, profile, cases=ids)`` -> the
    #: verify summary of what the program wrote in ``out`` (the runs of the cases ``ids`` select by prefix, or
    #: all), judged by gdncheck's own process in place of ``verify``
    judge: str | None = None

    @property
    def stage_isolated(self) -> bool:
        return self.judged in ("stage_isolated", "fused")

    @property
    def fused(self) -> bool:
        return self.judged == "fused"

    def spec(self) -> str:
        """What ``gdncheck run`` is given: the built-in name, or the plug-in while there is none (an
        engine run by its own program: that program's command line)."""
        if self.command is not None:
            return " ".join(self.command).replace("{folder}", self.folder or ".")
        # the built-ins import numpy and the judge: only a run needs them
        from gdncheck.conformance.ports import implementations

        if self.impl in implementations.BUILTIN or self.fallback is None:
            return self.impl
        return self.fallback

    def glue_folder(self) -> Path | None:
        """The folder of an engine's own glue: ``$GDN_<NAME>_DIR``, else :attr:`folder` in the gdncheck
        checkout this package runs from (a wheel has none: the glue is not Python)."""
        if self.folder is None:
            return None
        env = os.environ.get(f"GDN_{self.name.upper().replace('-', '_')}_DIR")
        if env:
            return Path(env)
        return Path(__file__).resolve().parents[2] / self.folder


@dataclass(frozen=True)
class Allow:
    """Failing records a finding accounts for beside its first failing tensor: ``stage`` and ``tensor``
    (``'*'``: any), error / bound at most ``ratio``, NaN elements only where ``nan``."""

    stage: str
    tensor: str = "*"
    ratio: float = float("inf")
    nan: bool = False


@dataclass(frozen=True)
class Finding:
    """What the summary cannot say about a case: why, and a standalone script that shows it.

    In an engine's folder a finding names the cases it is for: ``case`` (a case id prefix) and ``profile``
    (or ``'*'``); the registry keys it ``(engine, case, profile)``."""

    cls: str
    explanation: str
    repro: str | None = None  # a script's path from the repository root (conformance/engines/<name>/repros/)
    #: what was measured for it, which the summary must show: adjudication fields and their values; ``ratio``
    #: a (low, high) range of error / bound; ``nan`` True (NaN elements in the first failing tensor) or False
    expect: Mapping[str, Any] = field(default_factory=dict)
    #: the finding may not occur on every machine (a tie order left to a C++ library or SIMD path): never stale
    may_not_occur: bool = False
    #: the other failing tensors it accounts for (what its error causes downstream, measured): every failing
    #: record of a case must be the first failing tensor's (``expect``: its stage and tensor, its ratio at most
    #: ``expect``'s high end, NaN only where ``expect`` allows it) or one of these, else the case is unexplained
    also: tuple[Allow, ...] = ()
    case: str | None = None  # the case id prefix it explains (in an engine folder's FINDINGS)
    profile: str = "*"  # the profile it explains, or '*': every profile


Key = tuple[str, str, str]  # (engine, case id prefix, profile or '*')
