"""What each mutant's failure truly is: its ground-truth symptoms, declared by hand from the bug's
definition (never from what ``conformance/judge/symptoms.py`` says), so that the leave-one-class-out
matrix (``kill_matrix.leave_one_out``) can judge the symptoms independently.

``TRUTH[name]`` maps a kind of fact (the part of a symptom's code before ``:``: ``heads``, ``tokens``,
``calls``, ``rows``, ``slots``, ``channels``, ``equals``, ``relation``, ``precision``, ``nonfinite``,
``order``, ``eps``, ``error``, ``values``, ``decay``; :data:`DEFAULT_KINDS` for those a mutant leaves out)
to the codes that are true of the bug at its first divergence, on every case. A stated fact of a declared
kind whose code is not listed is **wrong**; a fact of a kind the mutant does not declare is
**unverified** (counted apart, never as true). Where a kind depends on the case it is left undeclared:
which heads a scale bug shows on (on sigmoid-edges a fully forgetting head's core is zero, and zero
times any scale is within the bound).
"""

from __future__ import annotations

ANY_HEADS = frozenset({"all", "some", "one", "group", "stride"})
EVERY = frozenset({"all"})
#: codes that say something specific (the rest, every head or every token, are true of most bugs)
GENERIC = frozenset({"heads:all", "tokens:all", "tokens:seq_start", "nonfinite:appear"})


def _t(**kinds) -> dict[str, frozenset]:
    return {k: frozenset(v) for k, v in kinds.items()}


#: where every element of a tensor is off (a bug in a per-element map): every token and head
_PER_ELEMENT = dict(tokens={"all", "seq_start"})
#: a commit or a snapshot that keeps the wrong one of the verify's states: in the step's own slots (or
#: its snapshot destinations), holding another state of the window (or the one before it)
_COMMIT = dict(slots={"own", "snapshot", "mixed"}, equals={"draft_state", "before", "other_slot"})

#: a gate's nonlinearity replaced (or clamped): each head's values a monotone function of the golden's,
#: which on a head whose input barely varies (an edge case's constant b) is one scale for the head
_MAP = {"monotone_map", "per_head_scale"}

#: non-finite values where the golden is finite, on the heads whose cumulative decay underflows float32
#: (a quotient or a masked product of exponentials of the chunk's cumulative decay: 0/0, inf·0)
_UNDERFLOW = {"appear", "decay_underflow"}

#: kinds of fact declared for every mutant unless it says otherwise: a stated precision (the port's values
#: on a coarser grid) or order of the decay is wrong for a mutant that declares none; non-finite values
#: where the golden is finite are a measurement, true wherever stated ("appear"), their cause is not;
#: an error only where a norm's eps decides is an eps bug's ("eps"); an absolute error in the gates ("error")
#: and gate values lost to exactly 0 ("values") are declared only where a bug's arithmetic makes them (a stated
#: one is wrong elsewhere). "decay" (the failing heads are those whose decay is extreme) is a where-fact:
#: unverified where undeclared, like "heads".
DEFAULT_KINDS: dict[str, frozenset] = {"precision": frozenset(), "order": frozenset(), "eps": frozenset(),
                                       "nonfinite": frozenset({"appear"}), "error": frozenset(),
                                       "values": frozenset()}

#: a stale conv window: the first K−1 tokens of a sequence read it; a sequence no longer than K−1 (a verify
#: window of spec-decode) is all conv head, every token from its first
_CONV_HEAD = {"conv_head", "only0", "seq_start"}

TRUTH: dict[str, dict[str, frozenset]] = {
    "head_grouping_tiled": _t(heads={"some", "one", "stride", "group"}),
    "norm_weight_plain": _t(relation={"per_channel_scale"}, **_PER_ELEMENT),
    "missing_l2_norm": _t(relation={"vector_scale", "per_head_scale", "uniform_scale"}, **_PER_ELEMENT),
    "scale_doubled": _t(relation={"uniform_scale"}),
    # rmsnorm(c·s)·w against rmsnorm(c)·w·s: the ratio rms(c) / rms(c·s), one number per vector; which tokens
    # depends on the case: where mean(c²) is far below eps the norm is c / √eps and the gate commutes with it
    # (measured: token 0 of the MoE cases, whose core starts near zero)
    "gate_before_norm": _t(relation={"vector_scale", "norm_order"}),
    "decay_after_write": _t(tokens={"all", "from", "growing", "some", "seq_start"}, order={"decay_after_write"}),
    # a first call of one token from the zero state keeps the window before it: all zeros
    "conv_state_shifted": _t(relation={"window_shift"}, equals={"zero"}),
    "qkv_split_order": _t(equals={"other_tensor"}, **_PER_ELEMENT),
    "state_transposed": _t(relation={"transpose"}),
    "softplus_replaced": _t(relation=_MAP),
    # softplus(b) / sigmoid(b) grows with b (a ratio that is a function of b); which tokens depends on the
    # case: the two maps cross near b = −1.4, where the error is under a bf16 bound
    "sigmoid_replaced": _t(relation=_MAP | {"ratio_map"}),
    "bf16_recurrent_state": _t(relation={"rounding"}, precision={"bf16"}),
    "initial_state_ignored": _t(equals=set(), relation=set(), calls={"continuation"}),
    "snapshot_aliases_state": _t(tokens=_CONV_HEAD, calls={"continuation"}),
    "no_reset_on_mismatch": _t(tokens=_CONV_HEAD),
    "per_head_norm_read_as_shared": _t(relation={"head_channel_scale"}),
    "softplus_clamped_20": _t(relation=_MAP),
    "beta_clamped_15": _t(relation=_MAP),
    "l2norm_eps_max": _t(relation={"vector_scale", "per_head_scale"}),
    "l2norm_eps_outside_sqrt": _t(relation={"vector_scale", "per_head_scale"}),
    # x / (√ms + eps) against x / √(ms + eps): per vector the factor √(ms + eps) / (√ms + eps), above 1 and
    # growing as the vector's mean square ms falls (1 where ms ≫ eps, 1/√eps as ms → 0): "grows_small"
    "rmsnorm_eps_outside_sqrt": _t(relation={"vector_scale", "uniform_scale", "per_channel_scale"},
                                   eps={"small_norm", "grows_small"}),
    "gated_norm_eps_outside_sqrt": _t(relation={"vector_scale", "per_head_scale", "eps_placement"},
                                      eps={"small_norm", "grows_small"}),
    # (1 + w) / w per weight: a scale per channel, per (head, channel) where the weight is per head
    "gated_norm_weight_one_plus": _t(relation={"per_channel_scale", "head_channel_scale", "weight_offset"},
                                     **_PER_ELEMENT),
    # log(1 + e^x) in float32: 1 + e^x is rounded to float32's spacing near 1 (2^-24), so softplus carries an
    # absolute error of that size (times A in g) however small softplus(x) is: its relative error grows as
    # the value shrinks ("absolute"); below x ≈ −17, 1 + e^x is 1 and the log exactly 0 ("zero")
    "softplus_naive": _t(error={"absolute"}, values={"zero"}),
    "gate_f16": _t(relation={"rounding"}, precision={"f16"}),
    # e^g clamped to [1e-6, 1 − 1e-6]: the port differs from the golden only from a token whose decay is below
    # 1e-6 or above 1 − 1e-6 on, inside what symptoms.py calls extreme (outside [1e-4, 1 − 1e-4]): "extreme"
    "decay_clamped": _t(decay={"extreme"}),
    "f16_recurrent_state": _t(relation={"rounding"}, precision={"f16"}),
    "state_norm_clamp_1000": _t(relation={"per_head_scale", "uniform_scale"}),
    "decay_quotient_of_exps": _t(nonfinite=_UNDERFLOW),
    "state_heads_tiled": _t(relation={"head_perm"}, heads={"some", "stride", "group", "one"}),
    "conv_window_shifted": _t(relation={"shift_late"}),
    "l2norm_eps_clamp_sum": _t(relation={"vector_scale", "per_head_scale"}),
    "qk_norm_rms_form": _t(relation={"uniform_scale", "per_head_scale", "vector_scale"}, **_PER_ELEMENT),
    "state_bf16_write_back": _t(relation={"rounding"}, precision={"bf16"}),
    "state_read_transposed": _t(calls={"continuation"}),
    "stale_conv_state_on_reset": _t(tokens=_CONV_HEAD),
    # which tokens depends on the case: a core far below the norm's eps is normalised to nearly 0, and any
    # gate of it is within the bound (measured: token 0 of one-key-head in bf16)
    "output_gate_sigmoid": _t(relation={"ratio_map", "elementwise"}),
    "output_gate_missing_silu": _t(relation={"ratio_map", "elementwise"}),
    "conv_missing_silu": _t(relation={"monotone_map", "elementwise"}, **_PER_ELEMENT),
    "a_log_sign": _t(relation={"sign", "monotone_map"}),
    # g times exp(−exp(A_log)) / exp(A_log) per head: where exp(A_log) is a few units that factor is below
    # any bound, and the port's g is the zero tensor within it
    "a_log_converted_twice": _t(relation={"per_head_scale", "per_channel_scale", "monotone_map"},
                                equals={"zero"}),
    "chunk_masked_exp": _t(nonfinite=_UNDERFLOW),
    "converter_ab_heads_tiled": _t(heads={"some", "one", "stride", "group"}, relation={"head_perm"}),
    "gates_head_major_when_mha": _t(),
    # the sparse block's
    "softmax_after_topk": _t(),
    "routing_not_renormalised": _t(),
    "shared_gate_without_sigmoid": _t(),
    "shared_expert_dropped": _t(),
    "expert_gate_up_swapped": _t(),
    # the serving patterns'
    "conv_window_leaks": _t(tokens={"conv_head", "seq_start"}, rows={"some", "verify", "plain"}),
    "chunk_straddles": _t(),
    "slot_read_i_written_j": _t(slots={"own", "mixed"}, equals={"other_slot"}),
    "padding_slot_written": _t(),
    "commit_off_by_one": _t(**_COMMIT),
    "snapshot_chunk_late": _t(slots={"snapshot"}, equals={"other_slot", "draft_state"}),
    "commit_one_late": _t(**_COMMIT),
    "commit_capped_4": _t(**_COMMIT),
    "mixed_plain_rows_from_zero": _t(rows={"plain"}),
    "free_keeps_conv_state": _t(tokens=_CONV_HEAD),
    # a row of 1 + K tokens left unwritten (its slot as before the call), beside rows written right
    **{f"prefill_as_verify_{k}": _t(slots={"own", "mixed"}, equals={"before"}) for k in (1, 2, 3, 4)},
    # held out (heldout_mutants.py)
    "conv_weight_v_shifted": _t(channels={"v"}, **_PER_ELEMENT),
    "state_one_call_late": _t(equals=set(), calls={"continuation"}),
    "l2norm_eps_dk_times": _t(relation={"vector_scale", "per_head_scale"}),
    "z_one_token_late": _t(tokens={"from"}),
}


#: a relation that is a special case of another: true wherever one it specialises is (a uniform scale
#: is a scale per head whose heads agree). A sign flip is declared where true: a bug's scale may be
#: positive by construction (exp(−exp(A)) / exp(A)).
SPECIAL_CASE_OF = {
    "uniform_scale": {"per_head_scale", "per_channel_scale", "head_channel_scale", "vector_scale"},
    "per_head_scale": {"head_channel_scale", "vector_scale"},
    "per_channel_scale": {"head_channel_scale"},
}


def _widened(codes: frozenset) -> set:
    out, grew = set(codes), True
    while grew:
        grew = False
        for special, general in SPECIAL_CASE_OF.items():
            if special not in out and out & general:
                out.add(special)
                grew = True
    return out


def judge_fact(name: str, code: str) -> str:
    """``true``, ``wrong`` or ``unverified``: a stated symptom's code (``kind:what``) against mutant
    ``name``'s declared truth (a relation: its special cases too, :data:`SPECIAL_CASE_OF`)."""
    kind, _, what = code.partition(":")
    declared = {**DEFAULT_KINDS, **TRUTH.get(name, {})}
    if kind not in declared:
        return "unverified"
    true = _widened(declared[kind]) if kind == "relation" else declared[kind]
    return "true" if what in true else "wrong"


def specific(code: str) -> bool:
    return code not in GENERIC
