"""Loading an implementation by name: a built-in (``reference``, ``triton``, ``hf``, ``mlx``, ``fla``) or a plug-in
``MODULE:CALLABLE`` (the port contract, :mod:`gdncheck.harness.contract`; docs/plugins.md),
and the ``--option KEY=VALUE`` pairs passed to its factory, checked before anything runs
(:func:`check_options`): an option the factory does not take is a usage error, not one raised case
per fixture.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from gdncheck.errors import GDNError
from gdncheck.harness import Implementation

from . import implementations


def _dotted(name: str) -> bool:
    """Whether ``name`` is a dotted name of Python identifiers (``pkg.mod``, ``Factory.create``)."""
    return all(part.isidentifier() for part in name.split("."))


def parse_spec(spec: object) -> tuple[str, str] | None:
    """An implementation name -> ``None`` for a built-in, else ``(MODULE, CALLABLE)``, both dotted
    names of identifiers; anything else (``':'``, ``'.:x'``, ``'../../etc/passwd:x'``, a relative
    import, a path) is refused with :class:`GDNError` before anything is imported. The CLI
    (``gdncheck run``, ``gdncheck gate --impl``) and the pytest plugin (``--gdncheck-impl``) read the
    name with this one function."""
    builtins = ", ".join(repr(n) for n in implementations.BUILTIN)
    if isinstance(spec, str) and spec in implementations.BUILTIN:
        return None
    if not isinstance(spec, str) or ":" not in spec:
        raise GDNError(f"expected an implementation {builtins} or 'MODULE:CALLABLE', found {spec!r}")
    module_name, attr = spec.split(":", 1)
    for part, what in ((module_name, "MODULE a dotted module name: no file path, no relative import"),
                       (attr, "CALLABLE a dotted attribute name")):
        if not _dotted(part):
            raise GDNError(f"expected an implementation {builtins} or 'MODULE:CALLABLE' ({what}), found {spec!r}")
    return module_name, attr


def load_factory(spec: str) -> Callable[..., Implementation]:
    """A built-in name (``reference``, ``triton``, ``hf``, ``mlx``, ``fla``) or ``MODULE:CALLABLE`` -> the factory
    (:func:`parse_spec` reads the name). A module that cannot be imported, or whose import raises, and
    an attribute that is missing or not callable are :class:`GDNError` naming the implementation."""
    parsed = parse_spec(spec)
    if parsed is None:
        return implementations.BUILTIN[spec]
    module_name, attr = parsed
    # as `python -m` does: a port's module in the working directory is found (the `gdncheck` console
    # script, unlike `python -m gdncheck`, does not put the working directory on sys.path)
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise GDNError(f"cannot import module {module_name!r} for implementation {spec!r}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the port's module failed while importing: the port's error, not gdncheck's
        raise GDNError(f"importing module {module_name!r} for implementation {spec!r} raised "
                       f"{type(exc).__name__}: {exc}") from None
    factory = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise GDNError(f"module {module_name!r} has no attribute {attr!r} (implementation {spec!r})")
    if not callable(factory):
        raise GDNError(f"{spec!r} is not callable; expected a factory(cfg, weights, *, profile, strict)")
    return factory


def load_checked_factory(spec: str, options: Mapping[str, Any] | None = None) -> Callable[..., Implementation]:
    """:func:`load_factory`, then :func:`check_options`: the factory named by ``spec``, refused
    (:class:`GDNError`, a usage error) unless it can be called as a factory with ``options``. What
    ``gdncheck run``, ``gdncheck gate`` and the pytest plugin do before any case runs."""
    factory = load_factory(spec)
    check_options(factory, options or {}, spec)
    return factory


def parse_options(pairs: list[str] | None) -> dict[str, Any]:
    """``["placement=fla", "chunk_size=32"]`` -> ``{"placement": "fla", "chunk_size": 32}``."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        if "=" not in pair or not pair.split("=", 1)[0].isidentifier():
            raise GDNError(f"expected --option KEY=VALUE (KEY a name), found {pair!r}")
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


#: The options each built-in factory takes (it swallows ``**options`` to refuse the rest itself).
BUILTIN_OPTIONS: dict[str, tuple[str, ...]] = {
    "reference": ("placement", "chunk_size"),
    "triton": ("device", "capture", "delta_rule", "chunk_size"),
    "hf": (),
    "mlx": (),
    "fla": ("kernel", "chunk_size", "device"),
    "llamacpp": ("source", "threads"),
    "ggml": ("threads",),
}
#: Parameters every factory receives from the runner, never from ``--option``.
RUNNER_PARAMS = ("cfg", "weights", "profile", "strict")


def accepted_options(factory: Callable, spec: str | None = None) -> tuple[str, ...] | None:
    """The option names ``factory`` takes: a built-in's list, the factory's own ``options`` attribute
    (a plug-in may declare it), or its keyword parameters; None when it takes any (``**kwargs`` and
    no declaration)."""
    if spec in BUILTIN_OPTIONS:
        return BUILTIN_OPTIONS[spec]
    declared = getattr(factory, "options", None)
    if isinstance(declared, list | tuple) and all(isinstance(o, str) for o in declared):
        return tuple(declared)
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return tuple(p.name for p in params if p.kind in (inspect.Parameter.KEYWORD_ONLY,
                                                        inspect.Parameter.POSITIONAL_OR_KEYWORD)
                 and p.name not in RUNNER_PARAMS)


def check_options(factory: Callable, options: Mapping[str, Any], spec: str | None = None) -> None:
    """Refuse (:class:`GDNError`, a usage error) an option ``factory`` does not take, or a callable that
    cannot be called as a factory at all (docs/plugins.md), before any case runs."""
    name = spec or getattr(factory, "__qualname__", repr(factory))
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # no signature to read (some C callables): its first call will tell
        sig = None
    if sig is not None and spec not in BUILTIN_OPTIONS:
        try:
            sig.bind(None, None, profile="f32", strict=False, **{k: None for k in options})
        except TypeError as exc:
            raise GDNError(f"implementation {name!r} cannot be called as a factory "
                           f"CALLABLE(cfg, weights, *, profile, strict, **options) (docs/plugins.md): {exc}") from None
    known = accepted_options(factory, spec)
    if known is None:
        return
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise GDNError(f"implementation {name!r} takes no option {', '.join(map(repr, unknown))}; it takes "
                       + (", ".join(known) if known else "none"))
