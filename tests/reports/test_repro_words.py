"""A repro line is built only from gdncheck's own words (issue 43, item 6): the run it starts with reruns
the case from the suite verify judged against, into the folder verify read, in verify's profile and mode;
an outputs file's ``command`` gives it no more than a built-in implementation or a module of gdncheck and
its ``--option`` values. Before, a port's ``command`` metadata kept its own ``--fixtures`` (pasting the line
ran another suite) and its ``MODULE:CALLABLE`` (pasting it imported a module of the port's choosing), and
the report showed such a line from a summary as it was."""

from __future__ import annotations

import pytest

from gdncheck.conformance.judge.messages import checked_repro, repro

VERIFY = "gdncheck verify --fixtures fx --outputs out --profile f32 --stage-isolated --case c1"


@pytest.mark.parametrize("command", [
    "gdncheck run evil_port:factory --fixtures fx --out out --profile f32 --stage-isolated",
    "gdncheck run sitecustomize:x --fixtures fx --out out --profile f32 --stage-isolated",
    "gdncheck run gdncheckx.evil:f --fixtures fx --out out --profile f32 --stage-isolated",
])
def test_a_module_of_the_ports_choosing_is_never_in_a_repro(command):
    assert repro("fx", "out", "f32", "c1", stage_isolated=True, run_command=command) == VERIFY


def test_the_ports_own_suite_folder_and_profile_are_replaced_by_verifys():
    command = ("gdncheck run gdncheck.conformance.engines.sglang.adapter:sglang --fixtures /elsewhere/suite "
               "--out /tmp/x "
               "--profile bf16 --option kernel=packed_decode --tag t --stage-isolated")
    line = repro("fx", "out", "f32", "c1", stage_isolated=True, run_command=command)
    assert line == ("gdncheck run gdncheck.conformance.engines.sglang.adapter:sglang --fixtures fx --out out "
                    "--profile f32 "
                    "--option kernel=packed_decode --stage-isolated --case c1 && " + VERIFY)
    assert "/elsewhere" not in line and "bf16" not in line and "--tag" not in line
    assert checked_repro(line) == line  # as written, the report shows it


def test_the_report_cuts_a_summary_repro_whose_run_is_not_gdnchecks_own():
    for run in ("gdncheck run reference --fixtures /other/suite --out out --profile f32 --stage-isolated --case c1",
                "gdncheck run evil:f --fixtures fx --out out --profile f32 --stage-isolated --case c1",
                "gdncheck run reference --fixtures fx --out elsewhere --profile f32 --stage-isolated --case c1",
                "gdncheck run reference --fixtures fx --out out --profile f32 --stage-isolated --case c2"):
        assert checked_repro(f"{run} && {VERIFY}") == VERIFY, run
    own = "gdncheck run reference --fixtures fx --out out --profile f32 --stage-isolated --case c1"
    assert checked_repro(f"{own} && {VERIFY}") == f"{own} && {VERIFY}"
