"""The Hypothesis property suite, shipped in the package so ``gdncheck gate`` runs it wherever
gdncheck is installed.

The implementation under test is chosen the array-api-tests way, by environment variables:
``GDN_IMPL`` (``reference`` (default), ``triton`` or ``MODULE:CALLABLE``, the plug-in contract of
docs/plugins.md) and ``GDN_PROFILE`` (``f32`` (default), ``bf16``, ``f16``). Every property
compares the implementation with the float64 reference, or checks an exact identity; none compares
an implementation with itself, except the bit-exact snapshot round trip (an identity).

Run alone::

    GDN_IMPL=triton GDN_PROFILE=bf16 python -m gdncheck.conformance.properties [-k NAME] [--max-examples N]

Chapters (one module each): :mod:`.differential`, :mod:`.metamorphic`, :mod:`.delta_rule`,
:mod:`.state`, :mod:`.errors`, :mod:`.serving`.
"""

from . import delta_rule, differential, errors, metamorphic, serving, state  # noqa: E402,F401,I001 - register the chapters
from .registry import PROPERTIES, Property, PropertySkip, prop, subject_from_env

__all__ = ["PROPERTIES", "Property", "PropertySkip", "prop", "subject_from_env"]
