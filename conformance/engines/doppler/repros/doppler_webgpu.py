#!/usr/bin/env python3
"""Two defects of doppler-gpu 0.5.1's `linear_attention_recurrent` WGSL kernel
(src/gpu/kernels/linear-attention-core.js), each adjudicated against float64.

    python3 conformance/engines/doppler/repros/doppler_webgpu.py     # doppler's own WGSL, run by the Node glue
    python3 conformance/engines/doppler/repros/doppler_webgpu.py --numpy   # the kernel's statements in float64
    python3 conformance/engines/doppler/repros/doppler_webgpu.py --numpy --subgroup 32 --dk 128 --dv 128  # Qwen3.5's

By default it runs doppler's kernel itself, unchanged, through gdncheck's Node glue
(conformance/engines/doppler/run.js, or $GDN_DOPPLER_DIR; its README installs it) on two committed
cases and compares the states it returns with the float64 goldens: `decode_T12` as shipped (the race:
NaN or wrong lanes) and `softplus-edges` with the race fixed (`GDN_DOPPLER_PATCH=barrier`: the softplus).
Imports only numpy and the standard library (the cases' safetensors are read here by hand).

Exit 0 when neither defect reproduces (fixed), 1 while either does, 3 when it cannot run (no Node, the
glue's npm packages or the fixtures missing, no WebGPU adapter): never a verdict it did not measure.

1. A workgroup race (every GPU whose subgroups are narrower than the active lanes of a head):
   each reduction ends `workgroupBarrier(); let s = shared_sq[0];` and the very next statement
   group writes the next reduction's partials `shared_sq[vd] = ...` with no barrier between. A
   subgroup that reaches the write first overwrites shared_sq[0] (lane 0's slot) before the other
   subgroups have read it. Then lanes outside the first subgroup use lane 0's *k partial* as the
   q norm, lane 0's *|out|^2* as the k norm (and the next token's q partial as the RMS). WGSL calls
   this a data race; which value a lane reads depends on scheduling. lavapipe runs a workgroup one
   8-lane subgroup at a time between barriers, so there it is deterministic: every lane >= 8 is
   wrong, NaN or huge after a few tokens (24 of the 28 gdncheck cases). On a 32/64-wide GPU it hits
   when a head's active lanes span several subgroups: dv > 32 (Qwen3.5: dk = dv = 128, 4 warps of
   32 or 2 waves of 64 in the 128-thread workgroup), whenever warp 0 runs ahead. doppler's own
   regression test (dk = dv = 2) cannot see it. The fix: `workgroupBarrier();` after each read of
   shared_sq[0] (the fused decode kernel's reduce_sum has the same shape).
   This script executes the kernel's statement sequence for one head in float64, one subgroup at a
   time between barriers (a legal schedule on any GPU, lavapipe's actual one), with and without the
   barrier, and compares with the float64 definition of the gated delta rule.

2. softplus in float32 as `log(1.0 + exp(x))` for -20 <= x <= 20 (deterministic, every GPU): for
   x < about -16.6, exp(x) is below half an ulp of 1, so 1 + exp(x) rounds to 1 and softplus is 0;
   for -16 < x < -8 its relative error is ulp(1)/exp(x), 1e-4 to 1. g = -A * softplus(x) then loses
   a decay that matters whenever A = exp(A_log) is large: gdncheck's softplus-edges case has
   A = 1.465e7 and x = -19.13, so the true g = -0.0719 (decay 0.931 per token) and doppler's g = 0
   (no decay). The fix: `log1p(exp(x))` -- WGSL has no log1p, so e.g. `select(log(1.0 + e), e *
   (1.0 - 0.5 * e), e < 1e-4)` with e = exp(x), or the usual max(x, 0) + log(1 + exp(-|x|)) with a
   series for small terms.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

#: the exit status when the repro cannot run: neither fixed (0) nor reproduced (1)
CANNOT_RUN = 3
ROOT = Path(__file__).resolve().parents[4]
DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}


class CannotRun(Exception):
    pass


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """A safetensors file's float tensors (BF16 widened), read with numpy and json only."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = data[8 + n + start: 8 + n + end]
        if info["dtype"] == "BF16":
            arr = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=DTYPES[info["dtype"]])
        out[name] = arr.reshape(info["shape"])
    return out


def run_kernel(case: str, patch: bool) -> tuple[dict, dict]:
    """doppler's kernel on one committed case through the Node glue: (its outputs, the goldens)."""
    glue = Path(os.environ.get("GDN_DOPPLER_DIR") or ROOT / "conformance" / "engines" / "doppler")
    fixtures = ROOT / "fixtures" / "default"
    node = shutil.which("node")
    for what, ok in (("Node.js", node), (f"the glue {glue}/run.js", (glue / "run.js").is_file()),
                     (f"its npm packages ({glue}/node_modules: npm install there)",
                      (glue / "node_modules" / "doppler-gpu").is_dir()),
                     (f"the fixtures {fixtures}", (fixtures / "manifest.json").is_file())):
        if not ok:
            raise CannotRun(f"needs {what}")
    golden = next(fixtures.glob(f"{case}*.safetensors"), None)
    if golden is None:
        raise CannotRun(f"no committed case {case} in {fixtures}")
    env = {k: v for k, v in os.environ.items() if k not in ("GDN_DOPPLER_PATCH", "GDN_DOPPLER_GLUE_MUTANT")}
    if patch:
        env["GDN_DOPPLER_PATCH"] = "barrier"
    with tempfile.TemporaryDirectory() as out:
        run = subprocess.run([node, str(glue / "run.js"), "--fixtures", str(fixtures), "--out", out, "--case", case],
                             env=env, capture_output=True, timeout=600)
        said = (run.stdout + run.stderr).decode("utf-8", errors="replace").strip().splitlines()
        made = Path(out) / golden.name
        if run.returncode not in (0, 2) or not made.is_file():
            raise CannotRun(f"run.js exited {run.returncode}" + (f": {said[-1]}" if said else ""))
        return read_safetensors(made), read_safetensors(golden)


def state_error(got: dict, gold: dict, call: int = 0) -> np.ndarray:
    """Per value head: the relative Frobenius error of the kernel's recurrent state after ``call`` (inf
    where it holds NaN)."""
    key = f"calls.{call}.recurrent_state"
    a, e = got[key].astype(np.float64)[0], gold[key][0]
    err = np.sqrt(((a - e) ** 2).sum(axis=(1, 2)) / np.maximum((e ** 2).sum(axis=(1, 2)), 1e-300))
    return np.where(np.isnan(a).any(axis=(1, 2)), np.inf, err)


def on_the_kernel() -> int:
    """Both defects on doppler's own WGSL: 1 while either reproduces, 0 when neither does."""
    got, gold = run_kernel("decode_T12", patch=False)
    race_err = state_error(got, gold)
    raced = bool(np.any(race_err > 1e-3))
    print(f"1. the race, decode_T12 (dk = dv = 16), as shipped: recurrent state after call 0, relative error per "
          f"head {', '.join('NaN' if not np.isfinite(x) else f'{x:.2g}' for x in race_err)}"
          f" -> {'reproduces' if raced else 'not seen'}")
    patched, _ = run_kernel("decode_T12", patch=True)
    print(f"   with the barrier fix (GDN_DOPPLER_PATCH=barrier): "
          f"{', '.join(f'{x:.2g}' for x in state_error(patched, gold))}")
    got, gold = run_kernel("softplus-edges", patch=True)
    soft_err = state_error(got, gold)
    softened = bool(soft_err[3] > 1e-2)  # head 3: A = e^16.5 and a + dt_bias ~ -20 (fixtures/edge_weights.py)
    print(f"2. softplus as log(1 + exp(x)), softplus-edges with the race fixed: head 3 (A = 1.5e7, x ~ -19) state "
          f"relative error {soft_err[3]:.3g} (the other heads: "
          f"{', '.join(f'{x:.2g}' for i, x in enumerate(soft_err) if i != 3)}) -> "
          f"{'reproduces' if softened else 'not seen'}")
    return int(raced or softened)


def definition(q, k, v, a_neg, x_gate, b, z, w, eps_rms, s0):
    """The gated delta rule + gated norm in float64 (gdncheck FORMAT.md §5), one head."""
    dk = q.shape[1]
    S = s0.copy()
    out = []
    for t in range(q.shape[0]):
        qn = q[t] / np.sqrt(np.sum(q[t] ** 2) + 1e-6)
        kn = k[t] / np.sqrt(np.sum(k[t] ** 2) + 1e-6)
        g = a_neg * np.log1p(np.exp(x_gate[t]))
        beta = 1 / (1 + np.exp(-b[t]))
        S = np.exp(g) * S
        d = beta * (v[t] - kn @ S)
        S = S + np.outer(kn, d)
        o = dk ** -0.5 * (qn @ S)
        out.append(o / np.sqrt(np.mean(o ** 2) + eps_rms) * w * (z[t] / (1 + np.exp(-z[t]))))
    return np.array(out), S


def kernel(q, k, v, a_neg, x_gate, b, z, w, eps_rms, s0, subgroup, barrier_fix, wg=128):
    """doppler's linear_attention_recurrent for one head, statement for statement, float64, run one
    subgroup at a time between barriers (lanes of a subgroup in lockstep)."""
    dk, dv = q.shape[1], v.shape[1]
    lanes = np.arange(wg)
    groups = [lanes[i:i + subgroup] for i in range(0, wg, subgroup)]
    shared = np.zeros(wg)
    S = s0.copy()  # [dk, dv]; lane vd owns column vd
    out = np.zeros((q.shape[0], dv))

    def tree():
        stride = wg // 2
        while stride > 0:
            for L in groups:  # in lockstep inside a subgroup: read all, then write
                m = L[L < stride]
                shared[m] = shared[m] + shared[m + stride]
            stride //= 2  # workgroupBarrier()

    def partial(vec, L):
        return np.array([np.sum(vec[d::wg] ** 2) if d < len(vec) else 0.0 for d in L])

    qs = np.zeros(wg)
    ks = np.zeros(wg)
    for t in range(q.shape[0]):
        # (on token t > 0 this segment starts right after the previous inv_rms read: see below)
        for L in groups:
            shared[L] = partial(q[t], L)
        tree()
        # segment: read q norm, write k partials (the race, unless barrier_fix)
        def seg_write_k(L):
            shared[L] = partial(k[t], L)

        if barrier_fix:
            for L in groups:
                qs[L] = dk ** -0.5 / np.sqrt(shared[0] + 1e-6)
            for L in groups:
                seg_write_k(L)
        else:
            for L in groups:
                qs[L] = dk ** -0.5 / np.sqrt(shared[0] + 1e-6)
                seg_write_k(L)
        tree()
        beta = 1 / (1 + np.exp(-b[t]))
        g = a_neg * np.log1p(np.exp(x_gate[t]))  # the softplus defect is shown apart (part 2)
        outv = np.zeros(wg)

        def rule(L):
            ks[L] = 1 / np.sqrt(shared[0] + 1e-6)
            for vd in L[L < dv]:
                col = S[:, vd] * np.exp(g)
                kn = k[t] * ks[vd]
                col = col + kn * (v[t, vd] - col @ kn) * beta
                S[:, vd] = col
                outv[vd] = col @ (q[t] * qs[vd])

        def write_sq(L):
            shared[L] = np.where(L < dv, outv[L] ** 2, 0.0)

        if barrier_fix:
            for L in groups:
                rule(L)
            for L in groups:
                write_sq(L)
        else:
            for L in groups:
                rule(L)
                write_sq(L)
        tree()
        inv = np.zeros(wg)
        if barrier_fix or t + 1 == q.shape[0]:
            for L in groups:
                inv[L] = 1 / np.sqrt(shared[0] / dv + eps_rms)
        # without the fix, the next token's q partials race with this read too; emulate that by
        # letting only subgroup 0 read before the next token's first segment writes
        if not barrier_fix and t + 1 < q.shape[0]:
            for i, L in enumerate(groups):
                if i == 0:
                    inv[L] = 1 / np.sqrt(shared[0] / dv + eps_rms)
                    shared[L] = partial(q[t + 1], L)
                else:
                    inv[L] = 1 / np.sqrt(shared[0] / dv + eps_rms)
        zz = z[t]
        out[t] = outv[:dv] * inv[:dv] * w * (zz / (1 + np.exp(-zz)))
    return out, S


def race(args):
    rng = np.random.default_rng(0)
    T, dk, dv = args.tokens, args.dk, args.dv
    q, k = rng.standard_normal((T, dk)), rng.standard_normal((T, dk))
    v, z = rng.standard_normal((T, dv)), rng.standard_normal((T, dv))
    x_gate, b = rng.standard_normal(T), rng.standard_normal(T)
    w = 1 + 0.1 * rng.standard_normal(dv)
    a_neg = -np.exp(0.5)
    s0 = 0.1 * rng.standard_normal((dk, dv))
    ref_out, ref_S = definition(q, k, v, a_neg, x_gate, b, z, w, 1e-6, s0)
    print(f"1. workgroup race: one head, dk={dk}, dv={dv}, T={T}, 128-thread workgroup, subgroups of {args.subgroup}")
    shown = False
    for fix in (False, True):
        out, S = kernel(q, k, v, a_neg, x_gate, b, z, w, 1e-6, s0, args.subgroup, fix)
        with np.errstate(all="ignore"):
            err_lane = np.nanmax(np.abs(S - ref_S) / (np.abs(ref_S).max()), axis=0)
        bad = [int(i) for i in np.nonzero(~(err_lane < 1e-9))[0]]
        print(f"   {'with a barrier after each shared_sq[0] read' if fix else 'doppler as shipped (no barrier)'}: "
              f"state max rel error {np.nanmax(np.abs(S - ref_S)) / np.abs(ref_S).max():.3g}, "
              f"output max abs error {np.nanmax(np.abs(out - ref_out)):.3g}, NaN: {int(np.isnan(S).sum())}; "
              f"state columns (lanes) wrong: {bad if bad else 'none'}")
        shown |= bool(bad) and not fix
    return int(shown)


def softplus(args):
    f32 = np.float32
    print("2. softplus as f32 log(1 + exp(x)), the kernel's, against float64 log1p(exp(x))")
    for x in (-8.0, -12.0, -16.0, -17.0, -19.132204):
        e = np.exp(f32(x))
        dop = f32(np.log(f32(1) + e))
        ref = np.log1p(np.exp(np.float64(f32(x))))
        print(f"   x = {x:>10}: kernel {float(dop):.6e}, float64 {ref:.6e}, "
              f"relative error {abs(float(dop) - ref) / ref:.3g}")
    A = 14650719.428953517  # gdncheck softplus-edges_T68_Hk2_Hv8_dk16_dv16_s0, head 3: exp(A_log)
    x = f32(-19.132204)     # its call 0, token 6, head 3: a + dt_bias
    g_ref = -A * np.log1p(np.exp(np.float64(x)))
    g_dop = f32(-f32(A)) * f32(np.log(f32(1) + np.exp(x)))
    print(f"   softplus-edges, call 0, token 6, head 3: A = {A:.6g}, x = {float(x)}: float64 g = {g_ref:.6g} "
          f"(decay exp(g) = {np.exp(g_ref):.4f}); kernel g = {float(g_dop):.6g} (decay {float(np.exp(g_dop)):.4f})")
    return int(abs(float(g_dop) - g_ref) > 1e-3 * abs(g_ref))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--numpy", action="store_true",
                   help="run the kernel's statement order in float64 (NumPy) instead of doppler's WGSL")
    p.add_argument("--subgroup", type=int, default=8, help="--numpy: subgroup width (lavapipe 8, NVIDIA 32, AMD 32/64)")
    p.add_argument("--dk", type=int, default=16)
    p.add_argument("--dv", type=int, default=16)
    p.add_argument("--tokens", type=int, default=4)
    args = p.parse_args()
    if args.numpy:
        return max(race(args), softplus(args))
    try:
        return on_the_kernel()
    except (CannotRun, OSError, subprocess.TimeoutExpired) as exc:
        print(f"cannot run doppler's kernel here: {exc} (--numpy runs its statement order in float64 instead)",
              file=sys.stderr)
        return CANNOT_RUN


if __name__ == "__main__":
    raise SystemExit(main())
