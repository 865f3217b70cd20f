"""The symptoms of a failing tensor (conformance/judge/symptoms.py) on tensors built by hand: each
fact stated where it holds, none where it does not."""

import numpy as np

from gdncheck.conformance.judge.symptoms import measure

CFG = {"linear_num_key_heads": 2, "linear_num_value_heads": 6, "linear_key_head_dim": 4, "linear_value_head_dim": 4,
       "linear_conv_kernel_dim": 4, "hidden_size": 8}


def codes(facts):
    return {f.code for f in facts}


def core(seed=0, T=10):
    return np.random.default_rng(seed).normal(size=(1, T, 6, 4))


def test_uniform_scale_is_said_with_its_value():
    e = core()
    facts = measure(0.5 * e, e, "core", scale=1.0, elem=1e-3, profile="f32", config=CFG)
    assert "relation:uniform_scale" in codes(facts)
    assert "×0.5" in " ".join(f.text for f in facts)
    assert "heads:all" in codes(facts) and "tokens:all" in codes(facts)


def test_one_key_head_group_and_from_a_token():
    e = core()
    a = e.copy()
    a[:, 3:, 3:6] += 1.0  # the value heads of key head 1, from token 3 on
    facts = measure(a, e, "core", scale=1.0, elem=1e-3, profile="f32", config=CFG)
    assert {"heads:group", "tokens:from"} <= codes(facts)
    text = " ".join(f.text for f in facts)
    assert "key head 1" in text and "token 3" in text
    assert not any(c.startswith("relation:") for c in codes(facts))  # no scale explains an offset


def test_heads_in_the_tiled_order_found_by_assignment():
    e = core()
    hk, r = 2, 3
    tiled = np.array([(p % hk) * r + p // hk for p in range(6)])
    facts = measure(e[:, :, tiled], e, "core", scale=1.0, elem=1e-3, profile="f32", config=CFG)
    assert "relation:head_perm" in codes(facts)
    assert "tiled order" in " ".join(f.text for f in facts)


def test_tokens_shifted_one_late():
    e = core(T=12)
    a = e.copy()
    a[:, 1:] = e[:, :-1]
    assert "relation:shift_late" in codes(measure(a, e, "core", scale=1.0, elem=1e-3, profile="f32", config=CFG))


def test_v_channels_only():
    e = np.random.default_rng(1).normal(size=(1, 5, 2 * 2 * 4 + 6 * 4))
    a = e.copy()
    a[..., 16:] *= 1.3
    assert "channels:v" in codes(measure(a, e, "qkv_conv", scale=1.0, elem=1e-3, profile="f32", config=CFG))


def test_bf16_rounding_of_an_f32_tensor():
    e = core(T=16)
    mant, ex = np.frexp(e)
    a = np.ldexp(np.round(mant * 256) / 256, ex)  # 8 significand bits: bf16
    facts = measure(a, e, "core", scale=1e-6 * np.abs(e), elem=1.0, profile="f32", config=CFG)
    assert "relation:rounding" in codes(facts) and "bf16 ulp" in " ".join(f.text for f in facts)


def test_noise_states_no_relation():
    e = core()
    a = e + np.random.default_rng(9).normal(size=e.shape)
    facts = measure(a, e, "core", scale=1.0, elem=1e-3, profile="f32", config=CFG)
    assert not any(f.kind in ("relation", "equals") for f in facts), facts


def test_commit_slot_holding_another_draft_state():
    """slot 9 holds the state after 8 draft tokens of sequence 2; the commit asked for 4 (issue 42)."""
    rng = np.random.default_rng(3)
    step = {"op": "commit", "slots": [7, 4], "accepted": [2, 8], "snap_seq": [1], "snap_offset": [4],
            "snap_slot": [9], "seq_pos": [0, 0]}
    e = rng.normal(size=(10, 6, 4, 4))
    a = e.copy()
    a[9] = e[4]
    facts = measure(a, e, "recurrent_state", scale=1.0, elem=1e-3, profile="f32", config=CFG, step=step,
                    others={"after": e})
    text = " ".join(f.text for f in facts)
    assert "slots:snapshot" in codes(facts)
    assert ("slot 9 holds the state after 8 draft token(s) of sequence 1 (the golden of slot 4); the step asked "
            "for the state after 4 draft token(s) of sequence 1") in text


def test_commit_slot_left_unchanged():
    rng = np.random.default_rng(4)
    step = {"op": "commit", "slots": [1], "accepted": [3], "seq_pos": [0]}
    before, e = rng.normal(size=(2, 6, 4, 4)), rng.normal(size=(2, 6, 4, 4))
    a = e.copy()
    a[1] = before[1]
    facts = measure(a, e, "recurrent_state", scale=1.0, elem=1e-3, profile="f32", config=CFG, step=step,
                    others={"before": before, "after": e})
    assert "left unchanged, but this step should write it" in " ".join(f.text for f in facts)


def test_a_gate_of_z_changed_is_a_ratio_that_is_a_function_of_z():
    rng = np.random.default_rng(5)
    core, z = rng.normal(size=(1, 12, 6, 4)), rng.normal(size=(1, 12, 6, 4))
    silu = z / (1 + np.exp(-z))
    e, a = core * silu, core * z  # the output gate z instead of silu(z): a / e = 1 / sigmoid(z)
    facts = measure(a, e, "core_gated", scale=1.0, elem=1e-3, profile="f32", config=CFG,
                    others={"this call's golden z": z})
    # said exactly since the elementwise maps (nothing fitted); the ratio's rank fit stays for other gates
    assert "relation:elementwise" in codes(facts) and "replaced by z itself" in " ".join(f.text for f in facts)
    assert "relation:ratio_map" not in codes(measure(a, e, "core_gated", scale=1.0, elem=1e-3, profile="f32",
                                                     config=CFG, others={"this call's golden z": core}))


def test_a_stale_conv_window_is_a_column_shift():
    e = np.random.default_rng(6).normal(size=(1, 40, 3))
    a = np.concatenate([np.random.default_rng(7).normal(size=(1, 40, 1)), e[..., :-1]], axis=-1)
    assert "relation:window_shift" in codes(measure(a, e, "conv_state", scale=1.0, elem=1e-3, profile="f32",
                                                    config=CFG))


def test_the_first_failing_continuation():
    e = core(T=1)
    step = {"op": "decode", "seq_pos": [7]}
    facts = measure(e + 1, e, "core", scale=1.0, elem=1e-3, profile="f32", config=CFG, call_step=step, call=2,
                    earlier_pass=True)
    assert "calls:continuation" in codes(facts)
    for kw in ({"earlier_pass": False}, {"call_step": {"op": "forward", "seq_pos": [0]}}):
        args = {"call_step": step, "call": 2, "earlier_pass": True, **kw}
        assert "calls:continuation" not in codes(measure(e + 1, e, "core", scale=1.0, elem=1e-3, profile="f32",
                                                         config=CFG, **args))


def test_a_scale_per_vector_seen_through_bf16_rounding():
    """Each head's vector scaled (a normalisation's size) with the port's tensor rounded to bf16: the
    norm of the rounding leaves more than 1 % of the error, yet every failing element is within the
    bound of the fitted scale: said; an error of another shape is not, rounded alike."""
    rng = np.random.default_rng(8)
    e = rng.normal(size=(1, 16, 6, 16))
    s = rng.uniform(1.08, 1.12, size=(1, 16, 6, 1))  # an error of about 10 %, bf16 rounding about 0.2 %
    mant, ex = np.frexp(s * e)
    a = np.ldexp(np.round(mant * 256) / 256, ex)
    d = np.abs(e) + 0.1
    facts = measure(a, e, "core", scale=d, elem=0.005, profile="bf16", config=CFG)
    assert "relation:vector_scale" in codes(facts), facts
    other = e + 0.25 * rng.normal(size=e.shape)
    assert "relation:vector_scale" not in codes(measure(other, e, "core", scale=d, elem=0.005, profile="bf16",
                                                        config=CFG))
    # near the bound (the failing elements a few times past it) the many-number fit is not trusted
    assert "relation:vector_scale" not in codes(measure(a, e, "core", scale=d, elem=0.02, profile="bf16",
                                                        config=CFG))
