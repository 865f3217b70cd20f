"""gdncheck.conformance.ports: running implementations over the fixtures.

:mod:`.plugin` loads an implementation by name (a built-in or ``MODULE:CALLABLE``);
:mod:`.implementations` holds the built-ins (``reference``, ``triton``, ``hf``: :mod:`.hf` with
:mod:`.hf_trace`); :mod:`.run` drives one over the cases and writes its outputs in the port format
(``gdncheck run``). The contract a port keeps is :mod:`gdncheck.harness`. The engine adapters, one
module each with its registry row, docs page, tests and repros: README.md beside this file.
"""
