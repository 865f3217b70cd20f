"""gdncheck.conformance: judging implementations against the float64 reference, in floors.

- :mod:`.judge`: metrics, verdicts, messages, records, tolerances, ``verify`` and name tables;
- :mod:`.earn`: the precision-emulating layer and the derivation of the tolerance table;
- :mod:`.ports`: loading implementations (built-ins and plug-ins) and ``gdncheck run``;
- :mod:`.properties` (the Hypothesis property suite) and :mod:`.meta` (mutants that prove the suite
  catches known bugs): both stand on the ports and the judge, never on each other.

Each floor imports only the floors below it (tests/test_layers.py keeps it so). The port contract
and the program executor they share with the fixture builder are :mod:`gdncheck.harness`; the CI
gate that composes all of this with the reports is :mod:`gdncheck.gate`.
"""
