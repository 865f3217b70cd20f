"""The attack suite (issue 11, item 10): Hypothesis mutates outputs files, manifests and snapshot files
structurally, and for every draw ``verify`` (and ``run``, which writes) keeps the contract of
:mod:`.sandbox`: an exit code of 0, 1 or 2 that agrees with the verdict, no traceback, nothing written
outside the output folder, the untouched case still judged.

Examples per test follow the Hypothesis profile (``GDN_HYPOTHESIS_PROFILE``): ``ci`` draws 20,
derandomized (the same draws every run); ``nightly`` draws 500.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given

from gdncheck.errors import GDNError
from gdncheck.snapshot import Snapshot

from .mutations import (
    BYTE_KINDS,
    HEADER_KINDS,
    META_KINDS,
    file_kind_mutations,
    manifest_mutations,
    safetensors_mutations,
    snapshot_name_mutations,
)
from .sandbox import CASES, SNAPSHOT, TARGET, WITNESS, check, run, stage, verify_argv


def _verify(st, *cases: str) -> None:
    before = st.everything_but(st.out)
    ran = run(verify_argv(st, WITNESS, *cases), st.out / "verify-summary-f32.json")
    check(ran)
    assert st.everything_but(st.out) == before  # nothing written, changed or removed outside OUT


@given(mutation=safetensors_mutations(HEADER_KINDS))
def test_an_outputs_file_with_mutated_header_entries(base, mutation):
    with stage(base) as st:
        mutation.apply(st.out / f"{TARGET}.safetensors")
        _verify(st, TARGET)


@given(mutation=safetensors_mutations(META_KINDS))
def test_an_outputs_file_with_mutated_metadata(base, mutation):
    with stage(base) as st:
        mutation.apply(st.out / f"{TARGET}.safetensors")
        _verify(st, TARGET)


@given(mutation=safetensors_mutations((*BYTE_KINDS, "file_kind")))
def test_an_outputs_file_with_mutated_bytes_or_kind(base, mutation):
    with stage(base) as st:
        mutation.apply(st.out / f"{TARGET}.safetensors")
        _verify(st, TARGET)


@given(mutation=safetensors_mutations())
def test_a_mutated_snapshot_file(base, mutation):
    with stage(base) as st:
        (snap,) = st.snapshot_files()
        mutation.apply(snap)
        _verify(st, SNAPSHOT)
        try:  # read directly, the file is refused with a GDNError or is a snapshot that keeps the contract
            loaded = Snapshot.load(snap)
        except GDNError:
            return
        assert np.isfinite(loaded.conv_state).all() and np.isfinite(loaded.recurrent_state).all()
        assert (loaded.seq_len >= 0).all() and loaded.recurrent_state.ndim == 4


@given(mutation=manifest_mutations(case_index=CASES.index(TARGET)))
def test_a_mutated_manifest_entry(base, mutation):
    with stage(base) as st:
        mutation.apply(st.fixtures / "manifest.json")
        _verify(st, TARGET)


@given(mutation=manifest_mutations(case_index=CASES.index(SNAPSHOT)))
def test_run_writes_nothing_outside_its_folder_for_any_manifest(base, mutation):
    """``run`` executes a mutated program (snapshot files named by the manifest): whatever the draw, every
    file it writes is inside OUT, and the untouched case runs."""
    with stage(base) as st:
        mutation.apply(st.fixtures / "manifest.json")
        out = st.root / "run-out"
        before = st.everything_but(out)
        ran = run(["run", "reference", "--fixtures", str(st.fixtures), "--out", str(out), "--profile", "f32",
                   "--case", WITNESS, "--case", SNAPSHOT])
        text = ran.stdout + ran.stderr
        assert ran.code in (0, 2) and "Traceback" not in text and "internal error" not in text, text[-3000:]
        assert st.everything_but(out) == before  # every file it wrote is inside OUT
        if "selects no case" not in text and "no case matches" not in text:  # the draw renamed the case away
            assert (out / f"{WITNESS}.safetensors").is_file(), text


@given(mutation=snapshot_name_mutations())
def test_run_and_verify_keep_snapshot_files_inside_their_folder(base, mutation):
    """Hostile snapshot file names in the manifest: ``run`` writes, and ``verify`` reads, nothing outside."""
    with stage(base) as st:
        mutation.apply(st.fixtures / "manifest.json")
        out = st.root / "run-out"
        before = st.everything_but(out)
        ran = run(["run", "reference", "--fixtures", str(st.fixtures), "--out", str(out), "--profile", "f32",
                   "--case", WITNESS, "--case", SNAPSHOT])
        text = ran.stdout + ran.stderr
        assert ran.code in (0, 2) and "Traceback" not in text and "internal error" not in text, text[-3000:]
        assert st.everything_but(out) == before  # every file it wrote is inside OUT
        assert (out / f"{WITNESS}.safetensors").is_file(), text
        _verify(st, SNAPSHOT)


@given(mutation=file_kind_mutations())
def test_a_fixture_file_of_another_kind(base, mutation):
    with stage(base) as st:
        mutation.apply(st.fixtures / f"{TARGET}.safetensors")
        _verify(st, TARGET)
