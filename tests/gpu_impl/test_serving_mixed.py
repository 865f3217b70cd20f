"""Mixed serving batches and commit snapshots (issue 36) on the Triton path against the float64 reference's:
a decode, two verify windows (one of 8 draft tokens), a prefill longer than a chunk and a padding row in one
call, in vLLM's order; the verify rows' slots untouched until the commit, the plain rows' written; a commit
accepting 3 of 8 and all of 2, keeping states inside and at the end of an accepted window in other slots;
the errors changing nothing. Tiny shapes (interpreter)."""

from __future__ import annotations

import pytest
import torch

from gdncheck import errors as E
from gdncheck.calls import PAD_SLOT_ID
from gdncheck.gpu_impl import serving as G
from gdncheck.reference import serving as RS
from tests.gpu_impl.helpers import PROFILE_NAMES
from tests.gpu_impl.test_serving import (
    POOL,
    REF,
    assert_pool_matches,
    assert_untouched,
    check_outputs,
    layer,
    packed,
    pools,
    positions,
)


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_mixed_call_and_commit_snapshots_against_reference(profile):
    ref, gpu = pools(profile, seed=21)
    lay = layer(profile)
    lengths, slots, verify = [1, 8, 2, 20, 2], [4, 1, 6, 0, PAD_SLOT_ID], [0, 1, 1, 0, 0]
    x, cu = packed(lengths, seed=22)
    pos = positions(ref, slots)
    before = gpu.snapshot()
    got, trace, spec = G.forward_mixed(lay, gpu, x, cu, pos, slots, verify, capture=True)
    want, ref_trace, ref_spec = RS.forward_mixed(REF, ref, x, cu, pos, slots, verify)
    check_outputs(got, trace, want, ref_trace, cu, profile, "mixed call")
    assert_untouched(gpu, before, [1, 2, 3, 5, 6, 7])  # verify rows' slots and unnamed slots
    assert_pool_matches(gpu, ref, [0, 4], profile, "plain rows")
    accepted, snaps = [0, 3, 2, 0, 0], ([1, 1, 2], [1, 3, 2], [2, 3, 5])
    G.commit(spec, accepted, *snaps)
    RS.commit(ref_spec, accepted, *snaps)
    assert_pool_matches(gpu, ref, range(POOL), profile, "after the commit")
    assert gpu.seq_len[[1, 2, 3, 5, 6]].tolist() == [pos[1] + 3, pos[1] + 1, pos[1] + 3, pos[2] + 2, pos[2] + 2]


def test_mixed_errors_change_nothing():
    ref, gpu = pools("f32", seed=23)
    lay = layer("f32")
    slots = [2, 5]
    x, cu = packed([4, 2], seed=24)
    pos = positions(ref, slots)
    before = gpu.snapshot()
    with pytest.raises(E.InputShapeError, match="flags 0 or 1"):
        G.forward_mixed(lay, gpu, x, cu, pos, slots, [1, 2])
    assert_untouched(gpu, before, range(POOL))
    _, _, spec = G.forward_mixed(lay, gpu, x, cu, pos, slots, [1, 0])
    after = gpu.snapshot()
    with pytest.raises(E.AcceptCountError, match="plain"):
        G.commit(spec, [1, 1])
    with pytest.raises(E.SnapshotRequestError, match="accepted tokens"):
        G.commit(spec, [2, 0], [0], [3], [7])
    with pytest.raises(E.DuplicateSlotError, match="slot 5"):
        G.commit(spec, [2, 0], [0], [1], [5])
    assert_untouched(gpu, after, range(POOL))
    G.commit(spec, torch.tensor([4, 0]), [0], [4], [7])
    assert gpu.seq_len[[2, 7]].tolist() == [pos[0] + 4, pos[0] + 4]
    with pytest.raises(E.SpecCommitError, match="already committed"):
        G.commit(spec, [4, 0])
