"""``gdncheck demo``: the float64 reference on built-in weights, every stage printed."""

from __future__ import annotations

import argparse

import numpy as np

DESCRIPTION = """\
Run the float64 reference of the GDN layer on built-in synthetic weights (GVA ratio 2, dk != dv):
a prefill of a batch of two sequences, then decode steps, and print each stage tensor's shape and
RMS. Checks on the way that the chunked and recurrent delta rules agree and that prefill + decode
equals one prefill of the same tokens."""


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens", type=int, default=40, help="tokens per sequence (default 40)")
    p.add_argument("--decode", type=int, default=4, help="of which the last N run as decode steps (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic weights and inputs")


def run(args: argparse.Namespace) -> int:
    from gdncheck.env import limit_blas_threads
    from gdncheck.reference import Layer
    from gdncheck.stages import STAGES
    from gdncheck.synthetic import DEMO_CONFIG, make_inputs, make_weights

    limit_blas_threads()
    cfg = DEMO_CONFIG
    T, n_dec = args.tokens, min(args.decode, args.tokens - 1)
    layer = Layer(cfg, make_weights(cfg, seed=args.seed))
    x = make_inputs(cfg, 2, T, seed=args.seed + 1)
    print(f"gdncheck demo: float64 reference, {cfg.summary()}, norm mode {layer.norm_mode}")
    print(f"batch 2 x {T} tokens: prefill {T - n_dec}, then {n_dec} decode steps\n")

    full_state = layer.new_state(2)
    out_full, trace = layer.forward(x, full_state, 0)
    rec_state = layer.new_state(2)
    out_rec, _ = layer.forward(x, rec_state, 0, delta_rule="recurrent")

    split_state = layer.new_state(2)
    outs = [layer.forward(x[:, : T - n_dec], split_state, 0)[0]]
    for t in range(T - n_dec, T):
        outs.append(layer.forward(x[:, t : t + 1], split_state, t)[0])
    out_split = np.concatenate(outs, axis=1)

    print(f"{'stage':<12} {'tensor':<11} {'shape':<18} {'rms':>12}")
    for stage in STAGES:
        for spec in stage.tensors:
            arr = trace[spec.name]
            print(f"{stage.name:<12} {spec.name:<11} {str(list(arr.shape)):<18} {np.sqrt(np.mean(arr**2)):>12.6g}")
    print(f"{'state':<12} {'conv_state':<11} {str(list(full_state.conv_state.shape)):<18} "
          f"{np.sqrt(np.mean(full_state.conv_state**2)):>12.6g}")
    print(f"{'state':<12} {'recurrent_state':<11} {str(list(full_state.recurrent_state.shape)):<18} "
          f"{np.sqrt(np.mean(full_state.recurrent_state**2)):>12.6g}")

    def rel(a, b):
        return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))

    checks = [
        ("chunked vs recurrent delta rule, out", rel(out_full, out_rec)),
        ("chunked vs recurrent, recurrent_state", rel(full_state.recurrent_state, rec_state.recurrent_state)),
        ("prefill + decode vs one prefill, out", rel(out_split, out_full)),
        ("prefill + decode vs one prefill, state", rel(split_state.recurrent_state, full_state.recurrent_state)),
    ]
    print()
    ok = True
    for name, err in checks:
        good = err <= 1e-12
        ok &= good
        print(f"{'ok ' if good else 'BAD'} {name:<44} max rel error {err:.2e} (bound 1e-12)")
    return 0 if ok else 1
