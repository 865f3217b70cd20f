"""Mutants of bug classes the diagnosis's catalogue was not fitted on (issue 42 item 2): run by the
leave-one-class-out matrix (``kill_matrix.leave_one_out``) beside the catalogue's own, so that the
held-out set is not only the fitted one. Each is also a plug-in factory::

    gdncheck run gdncheck.conformance.meta.heldout_mutants:conv_weight_v_shifted --profile f32 --out out/

``l2norm_eps_dk_times`` is in the diagnosis's catalogue too (``catalogue.ALL_MUTANTS``): before, its
failure was named "a scale per head" (issue 42).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gdncheck.conformance.earn import lowp
from gdncheck.conformance.earn.emulate import EmulatedLayer
from gdncheck.conformance.earn.lowp import F32, f32

from .mutants import Mutant


@dataclass(frozen=True)
class HeldoutMutant(Mutant):
    module: str = "gdncheck.conformance.meta.heldout_mutants"


class ConvWeightVShifted(EmulatedLayer):
    """The conv weights of the v channels read one tap late (a converter that shifted one segment of
    ``conv1d.weight``): q and k convolve right, v with its taps [0, w0, w1, w2]."""

    def conv1d(self, qkv, conv_state):
        w = self.w["linear_attn.conv1d.weight"]
        c = self.cfg
        shifted = np.array(w, copy=True)
        lo = 2 * c.key_dim
        shifted[lo:, 1:] = w[lo:, :-1]
        shifted[lo:, 0] = 0
        saved = self.w["linear_attn.conv1d.weight"]
        self.w["linear_attn.conv1d.weight"] = shifted
        try:
            return super().conv1d(qkv, conv_state)
        finally:
            self.w["linear_attn.conv1d.weight"] = saved


class StateOneCallLate(EmulatedLayer):
    """From the third call on, the recurrent state handed to a call is the one the previous call
    started from (a double buffer swapped once too often after the first continuation)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._seen: list[np.ndarray] = []

    def delta_rule(self, q, k, v, g, beta, recurrent_state):
        seen = [s for s in self._seen if s.shape == recurrent_state.shape]
        read = seen[-1] if len(seen) >= 2 else recurrent_state
        self._seen = [*seen[-1:], np.array(recurrent_state, copy=True)]
        return super().delta_rule(q, k, v, g, beta, read)


class L2NormEpsDkTimes(EmulatedLayer):
    """q, k = x / sqrt(sum x^2 + dk * 1e-6): the eps of a mean-form norm applied to the sum (dk times
    too large); differs only where sum x^2 is comparable to dk * 1e-6."""

    def l2_normalize(self, x):
        dk = F32(np.shape(x)[-1])
        return f32(x) / np.sqrt(lowp.sum_last(f32(x) * f32(x), self.order) + dk * F32(1e-6))


class ZStateNotGated(EmulatedLayer):
    """The output gate's z read from the previous token (z shifted one token late in the stream)."""

    def gated_norm(self, core, z):
        late = np.array(z, copy=True)
        late[:, 1:] = z[:, :-1]
        return super().gated_norm(core, late)


HELDOUT_MUTANTS: tuple[Mutant, ...] = (
    HeldoutMutant("conv_weight_v_shifted", ConvWeightVShifted, "conv1d",
                  bug_class="conv weights of the v segment one tap late"),
    HeldoutMutant("state_one_call_late", StateOneCallLate, "delta_rule",
                  bug_class="recurrent state one call late"),
    HeldoutMutant("l2norm_eps_dk_times", L2NormEpsDkTimes, "qk_norm", ("qk-eps", 0),
           bug_class="L2-norm eps dk times too large", edge="qk-eps", edge_only=True),
    HeldoutMutant("z_one_token_late", ZStateNotGated, "gated_norm", bug_class="output gate z one token late"),
)
HELDOUT_BY_NAME = {m.name: m for m in HELDOUT_MUTANTS}

globals().update({m.name: m.factory for m in HELDOUT_MUTANTS})
