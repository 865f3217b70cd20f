"""Loading an implementation by name: a built-in (``reference``, ``triton``, ``hf``) or a plug-in
``MODULE:CALLABLE`` (the port contract, :mod:`gdncheck.harness.contract`; docs/plugins.md),
and the ``--option KEY=VALUE`` pairs passed to its factory.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from gdncheck.errors import GDNError
from gdncheck.harness import Implementation

from . import implementations


def load_factory(spec: str) -> Callable[..., Implementation]:
    """A built-in name (``reference``, ``triton``, ``hf``) or ``MODULE:CALLABLE`` -> the factory."""
    if spec in implementations.BUILTIN:
        return implementations.BUILTIN[spec]
    if ":" not in spec:
        raise GDNError(
            f"expected an implementation {', '.join(repr(n) for n in implementations.BUILTIN)} or "
            f"'MODULE:CALLABLE', found {spec!r}"
        )
    module_name, attr = spec.split(":", 1)
    # as `python -m` does: a port's module in the working directory is found (the `gdncheck` console
    # script, unlike `python -m gdncheck`, does not put the working directory on sys.path)
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise GDNError(f"cannot import module {module_name!r} for implementation {spec!r}: {exc}") from None
    factory = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise GDNError(f"module {module_name!r} has no attribute {attr!r} (implementation {spec!r})")
    if not callable(factory):
        raise GDNError(f"{spec!r} is not callable; expected a factory(cfg, weights, *, profile, strict)")
    return factory


def parse_options(pairs: list[str] | None) -> dict[str, Any]:
    """``["placement=fla", "chunk_size=32"]`` -> ``{"placement": "fla", "chunk_size": 32}``."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise GDNError(f"expected --option KEY=VALUE, found {pair!r}")
        key, value = pair.split("=", 1)
        for cast in (int, float):
            try:
                out[key] = cast(value)
                break
            except ValueError:
                continue
        else:
            out[key] = {"true": True, "false": False}.get(value.lower(), value)
    return out
