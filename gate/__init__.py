"""gdncheck.gate: the CI conformance gate (``gdncheck gate``), the top of the library.

:func:`run_gate` checks the fixtures, runs an implementation over the cases in every profile
(:mod:`.plan`, :mod:`.workers`), verifies them with the judge, searches the property suite, and
writes the gate summary, JUnit XML and the report (:mod:`.report`); known failures are read from
:mod:`.xfails`. It composes the judge, the ports, the properties and the reports, so it stands
above all of them, in a package of its own (docs/gate.md).
"""

from .run import SCHEMA_PATH, CouldNotRun, GateOptions, GateResult, run_gate, validate_gate_summary

__all__ = ["SCHEMA_PATH", "CouldNotRun", "GateOptions", "GateResult", "run_gate", "validate_gate_summary"]
