"""The engines of the cross-engine conformance matrix (``gdncheck engines``, docs/engines.md), found in
their folders.

Each engine is one folder ``conformance/engines/<name>/`` (``vllm-triton``: ``vllm_triton/``): its glue,
its ``engine.py`` (``ENGINE``, its registry entry; ``FINDINGS``, its known findings), its page (README.md),
its repros (``repros/``). :data:`ENGINES` and :data:`FINDINGS` are built by discovering those folders, in
the order :data:`ORDER` gives (the matrix's rows and docs/engines.md's tables); adding an engine is a folder
and one line of :data:`ORDER` (docs/layout.md, "Adding an engine").
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from gdncheck import errors

from .schema import Engine, Finding, Key

#: the folders in the matrix's order: the baseline first, then the engines as docs/engines.md lists them
ORDER = (
    "reference",
    "hf",
    "mlx",
    "fla",
    "fla_cp",
    "sglang",
    "llamacpp",
    "ggml",
    "keras",
    "onnxruntime",
    "doppler",
    "vllm",
    "vllm_triton",
    "vllm_tp",
)

HERE = Path(__file__).resolve().parent


def folders() -> list[str]:
    """Every engine folder here (a package holding an ``engine.py``): those :data:`ORDER` names in its
    order, then any other by name (a new folder runs before its line is written; a test asks for it)."""
    found = {m.name for m in pkgutil.iter_modules([str(HERE)]) if m.ispkg and (HERE / m.name / "engine.py").is_file()}
    return [n for n in ORDER if n in found] + sorted(found - set(ORDER))


def _load(folder: str) -> tuple[Engine, tuple[Finding, ...]]:
    module = importlib.import_module(f"{__package__}.{folder}.engine")
    return module.ENGINE, tuple(getattr(module, "FINDINGS", ()))


def _discover() -> tuple[dict[str, Engine], dict[Key, Finding]]:
    engines: dict[str, Engine] = {}
    findings: dict[Key, Finding] = {}
    for folder in folders():
        eng, table = _load(folder)
        if eng.name.replace("-", "_") != folder or eng.name in engines:
            raise errors.GDNError(f"expected conformance/engines/{folder}/engine.py to register the engine "
                                  f"{folder.replace('_', '-')!r} once, found {eng.name!r}")
        engines[eng.name] = eng
        for f in table:
            key = (eng.name, f.case, f.profile)
            if not f.case or key in findings:
                raise errors.GDNError(f"expected each finding of conformance/engines/{folder}/engine.py to name a "
                                      f"case id prefix and profile once, found {list(key)}"
                                      + (" twice" if f.case else ""))
            findings[key] = f
    return engines, findings


#: the registry, by engine name, in the matrix's order
ENGINES: dict[str, Engine]
#: the known findings of every engine, keyed by (engine, case id prefix, profile or '*')
FINDINGS: dict[Key, Finding]
ENGINES, FINDINGS = _discover()


def engine(name: str) -> Engine:
    """The registered engine ``name``; :class:`~gdncheck.errors.GDNError` naming the known ones otherwise."""
    if name not in ENGINES:
        raise errors.GDNError(f"expected an engine {', '.join(ENGINES)}, found {name!r}")
    return ENGINES[name]
