"""The compile check: every launch of the Triton path built for sm_90 as the JIT builds it, no GPU.

    python -m gdncheck.gpu_tools.compile_check            # the full plan: real sizes, every profile
    python -m gdncheck.gpu_tools.compile_check --quick    # decode (every profile) and bf16 prefill
    python -m gdncheck.gpu_tools.compile_check --tiny     # a tiny layer (the GPU check's dry run)
    ... --only REGEX --kernel REGEX                      # some scenarios, some kernels
    python -m gdncheck.gpu_tools.compile_check --moe      # the sparse (MoE) layer alone, real sizes
    ... --json PATH --markdown PATH                      # the table, as docs/gpu.md shows it

Inside `compile_only` every launch goes to a `Compiler` (registers, spills, shared memory,
`ctas_per_sm`, waves on 132 SMs); it fails (exit 1, `Compiler.problems`) on shared memory over
227 KB, any decode spill, and prefill spills over `PREFILL_SPILLS`.

How it builds, what it reads off the cubin, and the table: docs/gpu.md §2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import triton

from gdncheck.config import REAL, REAL_MOE, GDNConfig
from gdncheck.gpu_impl.target import SM90_SMS, Kernel, launch_hook
from gdncheck.untrusted import OneLineParser

#: sm_90 (H100 / H200) limits used for occupancy and the shared-memory check.
SM90 = {"regs_per_sm": 65536, "regs_per_partition": 16384, "reg_unit": 256, "max_warps": 64, "max_ctas": 32,
        "smem_per_sm": 233472, "smem_per_cta": 232448, "smem_reserved_per_cta": 1024}


def ctas_per_sm(regs: int, num_warps: int, shared: int) -> int:
    """Blocks of one kernel resident on one sm_90 SM: the least of the register file (allocated
    per warp in units of 256 registers, in 4 partitions of 16384), shared memory (228 KB per SM,
    1 KB reserved per block), 64 warps and 32 blocks."""
    warp_regs = math.ceil(max(regs, 1) * 32 / SM90["reg_unit"]) * SM90["reg_unit"]
    warps_by_regs = 4 * (SM90["regs_per_partition"] // warp_regs)
    by_smem = SM90["smem_per_sm"] // (shared + SM90["smem_reserved_per_cta"])
    return max(0, min(warps_by_regs // num_warps, by_smem, SM90["max_warps"] // num_warps, SM90["max_ctas"]))


#: Spill bytes per thread allowed in the prefill path (the decode path allows none, and neither
#: does any other kernel or precision): the chunked prefill's kernels with tf32x3 dots (the f32
#: and f16 profiles) at dk = dv = 128, C = 64 — the WU kernel, and the state kernel at its one
#: block BV = 16, any variant. What Triton 3.9 builds (WU 256-384 B, state 312-408 B: docs/gpu.md
#: §3) rounded up to 64 B. Why they remain: tf32x3 splits both operands of every product into a
#: tf32 pair, and the split [C, dk/2] and [C, C] operands stay in registers in every arrangement
#: measured (8 warps: each warp group holds them whole, 880 B; four parts of dk, pipelining and
#: decays on the results' rows: each spills more). bf16 (tf32 dots) builds without spills.
#: The packed (VARLEN) WU kernel with tf32 dots (bf16) at dk = dv = 128, C = 64, 8 warps: Triton 3.9
#: builds it without spills (253 registers), Triton 3.6 (an H200 image's, measured 2026-12-04) with
#: 72 B: a sequence starts at any token, so the [C, dk/2] tiles' addresses cannot be proven aligned
#: and vectorised as the unpacked form's are (which builds without spills under both). 128 B allowed.
PREFILL_SPILLS = {("chunk_wu_kernel", "tf32x3"): 384, ("chunk_state_kernel", "tf32x3", 16): 448,
                  ("chunk_wu_kernel", "tf32", "varlen"): 128}


def spill_allowance(kernel: str, params: dict) -> int:
    """Spill bytes per thread a prefill build of ``kernel`` with ``params`` may have (:data:`PREFILL_SPILLS`)."""
    key = (kernel, params.get("PREC")) + ((params.get("BV"),) if kernel == "chunk_state_kernel" else ())
    if kernel == "chunk_wu_kernel" and params.get("VARLEN") and key + ("varlen",) in PREFILL_SPILLS:
        key += ("varlen",)
    return PREFILL_SPILLS.get(key, 0)


@dataclass
class Build:
    """One compiled variant of a kernel and the launches that use it."""

    kernel: str
    params: dict  # constexprs and launch options
    specialised: list[str]  # runtime integers the JIT turned into constants (== 1)
    regs: int
    local_bytes: int
    shared: int
    num_warps: int
    ctas_per_sm: int
    compile_s: float
    uses: list[dict] = field(default_factory=list)  # {"scenario", "grid", "waves", "decode"}

    @property
    def decode(self) -> bool:
        return any(u["decode"] for u in self.uses)

    def problems(self) -> list[str]:
        found = []
        if self.shared > SM90["smem_per_cta"]:
            found.append(f"{self.kernel} {self.params}: {self.shared} B of shared memory per block, over sm_90's "
                         f"{SM90['smem_per_cta']} B (227 KB)")
        if self.local_bytes and self.decode:
            found.append(f"{self.kernel} {self.params}: {self.local_bytes} B of spills per thread in the decode path")
        elif self.local_bytes > spill_allowance(self.kernel, self.params):
            found.append(f"{self.kernel} {self.params}: {self.local_bytes} B of spills per thread in the prefill "
                         f"path, over the {spill_allowance(self.kernel, self.params)} B allowed (PREFILL_SPILLS)")
        if self.ctas_per_sm == 0:
            found.append(f"{self.kernel} {self.params}: not one block fits on an SM")
        return found


class _FakeCuda:
    """The few driver calls ``JITFunction.run`` makes, answered for an sm_``arch`` device 0."""

    def __init__(self, arch: int):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


@contextlib.contextmanager
def _driver(arch: int) -> Iterator[None]:
    from triton.runtime.driver import driver

    saved = driver._active  # not reset_active(): that builds the default driver, which needs a GPU
    driver.set_active(_FakeCuda(arch))
    try:
        yield
    finally:
        driver._active = saved


def _resources(cubin: bytes) -> tuple[int, int]:
    """(registers per thread, local bytes per thread) of the cubin's one function."""
    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([knobs.nvidia.cuobjdump.path, "-res-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", out)
    if not m:
        raise RuntimeError(f"cuobjdump -res-usage: no resource line in {out!r}")
    return int(m.group(1)), max(int(m.group(2)), int(m.group(3)))


class Compiler:
    """The launch hook of :func:`compile_only`: builds each launch, records resources and uses."""

    def __init__(self, arch: int = 90, kernels: str | None = None):
        from triton.runtime.jit import JITFunction

        self.arch = arch
        self.kernels = re.compile(kernels) if kernels else None  # only kernels whose name matches
        self.scenario = ""
        self.decode = False
        self.builds: dict[tuple[str, str], Build] = {}
        self._jits: dict[Kernel, JITFunction] = {}  # by kernel, not name: a name's JIT binds its own signature
        self._jit_type = JITFunction

    def launch(self, k: Kernel, grid: tuple[int, ...], kwargs: dict) -> None:
        if self.kernels and not self.kernels.search(k.__name__):
            return
        # a JITFunction of our own: its binder caches the sm_90 target for "device 0"
        jit = self._jits.setdefault(k, self._jit_type(k.fn))
        t0 = time.perf_counter()
        with _driver(self.arch):
            compiled = jit.warmup(grid=grid, **kwargs)
        key = (k.__name__, compiled.hash)
        build = self.builds.get(key)
        if build is None:
            regs, local = _resources(compiled.asm["cubin"])
            names = k.params
            consts = [names[i[0]] for i in compiled.src.constants if i[0] < len(names)
                      and names[i[0]] in kwargs and not _is_constexpr(k, names[i[0]])]
            params = {n: kwargs[n] for n in names if n in kwargs and _is_constexpr(k, n)}
            params.update({n: kwargs[n] for n in Kernel.OPTIONS if n in kwargs})
            warps = compiled.metadata.num_warps
            build = self.builds[key] = Build(
                kernel=k.__name__, params=params, specialised=sorted(consts), regs=regs, local_bytes=local,
                shared=compiled.metadata.shared, num_warps=warps,
                ctas_per_sm=ctas_per_sm(regs, warps, compiled.metadata.shared), compile_s=time.perf_counter() - t0)
        ctas = math.prod(grid)
        waves = math.ceil(ctas / (SM90_SMS * build.ctas_per_sm)) if build.ctas_per_sm else float("inf")
        build.uses.append({"scenario": self.scenario, "grid": list(grid), "waves": waves, "decode": self.decode})

    def problems(self) -> list[str]:
        return [p for b in self.builds.values() for p in b.problems()]


def _is_constexpr(k: Kernel, name: str) -> bool:
    import inspect

    ann = inspect.signature(k.fn).parameters[name].annotation
    return ann is not inspect.Parameter.empty and "constexpr" in str(ann)


@contextlib.contextmanager
def compile_only(arch: int = 90, kernels: str | None = None) -> Iterator[Compiler]:
    """Inside this block launches compile for ``cuda:sm_{arch}`` as the JIT would, and run nothing
    (``kernels``: a regular expression; launches of other kernels are skipped)."""
    with launch_hook(Compiler(arch, kernels)) as compiler:
        yield compiler


@contextlib.contextmanager
def scenario(compiler: Compiler, name: str, decode: bool = False) -> Iterator[None]:
    compiler.scenario, compiler.decode = name, decode
    try:
        yield
    finally:
        compiler.scenario, compiler.decode = "", False


# --- the plan: what the layer, the tests and the benchmark launch ----------------------------------

TINY = GDNConfig(hidden_size=32, intermediate_size=48, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8,
                 conv_kernel=4)
TINY_MOE = TINY.replace(intermediate_size=None, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                        shared_expert_intermediate_size=24)


def layer_call(cfg: GDNConfig, profile: str, B: int, T: int, capture: bool = False, chunk: int = 64,
               delta_rule: str = "auto") -> None:
    """One call of the layer at [B, T] on meta tensors (from a state one token in, so in place)."""
    from gdncheck.gpu_impl.layer import Layer

    layer = Layer.shaped(cfg, profile=profile, chunk_size=chunk, delta_rule=delta_rule)
    state = layer.new_state(B)
    x = torch.empty((B, T, cfg.hidden_size), dtype=layer.dtype, device="meta")
    layer.forward(x, state, 1, capture=capture)


def delta_rule_call(form: str, B: int, T: int, Hk: int, Hv: int, d: int, dtype=torch.bfloat16, chunk: int = 64):
    """The benchmark's delta-rule calls: contiguous q, k [B, T, Hk, d], v [B, T, Hv, d], state in place."""
    from gdncheck.gpu_impl.delta_rule import delta_rule_recurrent
    from gdncheck.gpu_impl.delta_rule_chunked import delta_rule_chunked

    def meta(*shape, dt=dtype):
        return torch.empty(shape, dtype=dt, device="meta")

    q, k, v = meta(B, T, Hk, d), meta(B, T, Hk, d), meta(B, T, Hv, d)
    g, beta, S = meta(B, T, Hv, dt=torch.float32), meta(B, T, Hv, dt=torch.float32), meta(B, Hv, d, d,
                                                                                          dt=torch.float32)
    if form == "recurrent":
        delta_rule_recurrent(q, k, v, g, beta, S, None, out_state=S)
    else:
        delta_rule_chunked(q, k, v, g, beta, None, None, chunk)


def serving_call(cfg: GDNConfig, profile: str, lengths, pattern: str = "forward", chunk: int = 64) -> None:
    """One packed call of gpu_impl/serving.py on meta tensors: N sequences of the given lengths on
    slots 2N-2, ..., 2, 0 of a pool of 2N (permuted, half of them unused). ``pattern``: ``forward``,
    ``verify`` (every token's state kept), ``snapshots`` (prefix snapshots of the first sequence
    after one and two chunks, to odd slots), ``snapshots-inside`` (after one chunk and inside the
    second)."""
    import numpy as np

    from gdncheck.gpu_impl.layer import Layer
    from gdncheck.gpu_impl.serving import StatePool, forward_packed, prefix_snapshots, verify_spec

    layer = Layer.shaped(cfg, profile=profile, chunk_size=chunk)
    n = len(lengths)
    pool = StatePool.for_layer(layer, 2 * n)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    slots = 2 * np.arange(n)[::-1]
    x = torch.empty((int(cu[-1]), cfg.hidden_size), dtype=layer.dtype, device="meta")
    if pattern == "forward":
        forward_packed(layer, pool, x, cu, 0, slots)
    elif pattern == "verify":
        verify_spec(layer, pool, x, cu, 0, slots)
    else:
        second = chunk + (chunk // 2 if pattern == "snapshots-inside" else chunk)
        prefix_snapshots(layer, pool, x, cu, 0, slots, [0, 0], [chunk, second], [1, 3])


def moe_plan(profiles: tuple[str, ...] = ("bf16", "f32", "f16")) -> list[tuple[str, bool, Callable[[], None]]]:
    """The sparse layer at :data:`REAL_MOE` sizes in each profile: decode at B = 1 and 64 (the
    decode path: no spill allowed), a prefill of T = 4096 (B = 1); and a bf16 prefill with capture
    (the combine kernel storing experts_out and shared_out too)."""
    steps: list[tuple[str, bool, Callable[[], None]]] = []
    for p in profiles:
        for B in (1, 64):
            steps.append((f"moe layer {p} decode B={B}", True, lambda p=p, B=B: layer_call(REAL_MOE, p, B, 1)))
        steps.append((f"moe layer {p} prefill B=1 T=4096", False, lambda p=p: layer_call(REAL_MOE, p, 1, 4096)))
    steps.append(("moe layer bf16 prefill capture B=2 T=100", False,
                  lambda: layer_call(REAL_MOE, "bf16", 2, 100, capture=True)))
    return steps


def plan(quick: bool = False, tiny: bool = False, moe: bool = False) -> list[tuple[str, bool, Callable[[], None]]]:
    """(scenario, decode path?, call) for every launch configuration a GPU run makes.

    Layer calls at Qwen3.5 sizes in every profile: decode at B = 1 and 64, a recurrent prefill
    (16 tokens), chunked prefills at T = 8192 (B = 1 and 64) and with capture; the benchmark's
    delta-rule calls (decode Hv 32/48/64 × B 1/64/256, prefill T 8192/32768); the sparse layer
    (:func:`moe_plan`). ``quick``: decode in every profile and the bf16 prefill at T = 8192, B = 1.
    ``tiny``: a tiny layer in bf16, dense and sparse, decode and a chunked prefill, and tiny serving
    calls (seconds; the GPU check's dry run). ``moe``: the sparse layer's steps alone.

    The serving calls (gpu_impl/serving.py): decode at B = 64 with slot indices (a decode path:
    no spill allowed) and the packed prefill of the benchmark (8 mixed lengths, 8192 tokens:
    ``bench.SERVING_GPU``), in bf16 (quick) or every
    profile; the full plan adds a bf16 speculative verify (64 sequences of 4 tokens, every step
    kept) and bf16 prefix snapshots (at chunk ends; inside a chunk)."""
    from .bench import GPU, SERVING_GPU

    packed = SERVING_GPU.lengths  # 8 mixed lengths, 8192 tokens
    if tiny:
        return [("tiny layer bf16 decode B=2", True, lambda: layer_call(TINY, "bf16", 2, 1)),
                ("tiny layer bf16 prefill B=2 T=40", False, lambda: layer_call(TINY, "bf16", 2, 40, chunk=16)),
                ("tiny serving bf16 decode B=3 slots", True, lambda: serving_call(TINY, "bf16", [1, 1, 1])),
                ("tiny serving bf16 packed prefill 1+5+17+18", False,
                 lambda: serving_call(TINY, "bf16", [1, 5, 17, 18], chunk=16)),
                ("tiny moe layer bf16 decode B=2", True, lambda: layer_call(TINY_MOE, "bf16", 2, 1)),
                ("tiny moe layer bf16 prefill B=2 T=40", False,
                 lambda: layer_call(TINY_MOE, "bf16", 2, 40, chunk=16))]
    if moe:
        return moe_plan()

    steps: list[tuple[str, bool, Callable[[], None]]] = []
    profiles = ("bf16", "f32", "f16")
    for p in profiles:
        for B in (1, 64):
            steps.append((f"layer {p} decode B={B}", True, lambda p=p, B=B: layer_call(REAL, p, B, 1)))
        if quick and p != "bf16":
            continue
        steps.append((f"layer {p} prefill B=1 T=8192", False, lambda p=p: layer_call(REAL, p, 1, 8192)))
        if quick:
            continue
        steps.append((f"layer {p} prefill B=1 T=16", False, lambda p=p: layer_call(REAL, p, 1, 16)))
        steps.append((f"layer {p} prefill B=64 T=8192", False, lambda p=p: layer_call(REAL, p, 64, 8192)))
        steps.append((f"layer {p} prefill capture B=2 T=100", False,
                      lambda p=p: layer_call(REAL, p, 2, 100, capture=True)))
    for p in profiles[:1] if quick else profiles:
        steps.append((f"serving {p} decode B=64 slots", True, lambda p=p: serving_call(REAL, p, [1] * 64)))
        steps.append((f"serving {p} packed prefill 8 seqs T={sum(packed)}", False,
                      lambda p=p: serving_call(REAL, p, packed)))
    if not quick:
        steps.append(("serving bf16 verify B=64 k=4", True, lambda: serving_call(REAL, "bf16", [4] * 64, "verify")))
        steps.append(("serving bf16 prefix snapshots at chunk ends", False,
                      lambda: serving_call(REAL, "bf16", packed, "snapshots")))
        steps.append(("serving bf16 prefix snapshots inside a chunk", False,
                      lambda: serving_call(REAL, "bf16", packed, "snapshots-inside")))
    if not quick:
        for Hv in GPU.Hv_decode:
            for B in GPU.batches:
                steps.append((f"bench decode Hv={Hv} B={B}", True,
                              lambda Hv=Hv, B=B: delta_rule_call("recurrent", B, 1, GPU.Hk, Hv, GPU.dk)))
        for T in GPU.tokens:
            steps.append((f"bench prefill T={T}", False,
                          lambda T=T: delta_rule_call("chunked", 1, T, GPU.Hk, GPU.Hv_prefill, GPU.dk,
                                                      chunk=GPU.chunk)))
        steps += moe_plan()
    return steps


def only(steps, pattern: str | None):
    """The steps whose scenario name matches the regular expression ``pattern`` (all if None)."""
    return steps if not pattern else [s for s in steps if re.search(pattern, s[0])]


def run_plan(steps, arch: int = 90, progress=None, kernels: str | None = None) -> Compiler:
    with compile_only(arch, kernels) as compiler:
        for name, decode, call in steps:
            with scenario(compiler, name, decode):
                call()
            if progress:
                progress(name)
    return compiler


# --- the table -------------------------------------------------------------------------------------


def table(compiler: Compiler) -> dict:
    """The builds as rows; variants that differ only in the JIT's divisibility marks (e.g. a row
    offset of 132 or of 0) and build alike share a row, with their uses merged."""
    rows: dict[tuple, dict] = {}
    for b in sorted(compiler.builds.values(), key=lambda b: (b.kernel, str(b.params))):
        key = (b.kernel, str(b.params), tuple(b.specialised), b.regs, b.local_bytes, b.shared)
        if key in rows:
            rows[key]["uses"] += b.uses
            rows[key]["problems"] += b.problems()
            continue
        row = rows[key] = asdict(b)
        row["problems"] = b.problems()
    for row in rows.values():
        row["worst_waves"] = max(u["waves"] for u in row["uses"])
    rows = list(rows.values())
    return {"arch": f"sm_{compiler.arch}", "triton": triton.__version__, "torch": torch.__version__,
            "builds": rows, "problems": compiler.problems()}


_SHORT = {"num_warps": "w", "num_stages": "s"}


def _params_text(params: dict) -> str:
    return " ".join(f"{_SHORT.get(k, k)}={v}" for k, v in params.items())


def _uses_text(uses: list[dict]) -> str:
    by_scenario: dict[str, list[dict]] = {}
    for u in uses:
        by_scenario.setdefault(u["scenario"], []).append(u)
    parts = []
    for name, us in by_scenario.items():
        waves = max(u["waves"] for u in us)
        grid = "×".join(str(g) for g in max(us, key=lambda u: math.prod(u["grid"]))["grid"])
        parts.append(f"{name} [{grid}, {waves} wave{'s' if waves != 1 else ''}]")
    return "; ".join(parts)


def markdown(result: dict) -> str:
    lines = [f"Compiled for {result['arch']} with Triton {result['triton']} (bundled ptxas), the JIT's "
             "specialisation; regs per thread, local (spill) bytes per thread, shared memory per block, "
             "blocks per SM; each use: the scenario, its largest grid and its waves on 132 SMs.", "",
             "| kernel | constexprs, options | const | regs | spill B | smem KB | CTA/SM | uses |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for r in result["builds"]:
        lines.append(f"| {r['kernel']} | {_params_text(r['params'])} | {','.join(r['specialised']) or '—'} | "
                     f"{r['regs']} | {r['local_bytes']} | {r['shared'] / 1024:.1f} | {r['ctas_per_sm']} | "
                     f"{_uses_text(r['uses'])} |")
    lines += ["", "Problems: " + ("; ".join(result["problems"]) if result["problems"] else "none")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m gdncheck.gpu_tools.compile_check", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--full", action="store_true", help="real sizes, every profile, the benchmark (default)")
    scope.add_argument("--quick", action="store_true", help="decode in every profile and the bf16 prefill only")
    scope.add_argument("--tiny", action="store_true", help="a tiny layer in bf16, dense and sparse (seconds)")
    scope.add_argument("--moe", action="store_true", help="the sparse (MoE) layer alone: real sizes, every profile")
    p.add_argument("--only", metavar="REGEX", help="only the plan's scenarios whose name matches (e.g. "
                   "'layer f32 prefill B=1 T=8192'); the table then covers those")
    p.add_argument("--kernel", metavar="REGEX", help="only build the kernels whose name matches (e.g. chunk_state)")
    p.add_argument("--json", metavar="PATH", help="write the table as JSON")
    p.add_argument("--markdown", metavar="PATH", help="write the table as Markdown")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    steps = only(plan(args.quick, args.tiny, args.moe), args.only)
    if not steps:
        print(f"compile_check: no scenario of the plan matches --only {args.only!r}", file=sys.stderr)
        return 2
    compiler = run_plan(steps, kernels=args.kernel, progress=lambda name: print(f"  built: {name} "
                                                                     f"({time.perf_counter() - t0:.0f} s)",
                                                                     file=sys.stderr, flush=True))
    result = table(compiler)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    text = markdown(result)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
