"""``gdncheck run``: run a Python implementation over the fixture cases, writing port-format outputs."""

from __future__ import annotations

import argparse
import shlex

from gdncheck.profiles import RUN_PROFILES

from .console import Console, add_output_arguments

DESCRIPTION = """\
Run an implementation over the fixture cases and write its outputs in the port format
(fixtures/FORMAT.md §7), one safetensors file per case, for `gdncheck verify`.

One writer per folder: the run holds --out's lock (.gdncheck.lock) until it ends, and a second
command writing there is refused (exit 2). A --out holding another run's outputs (another
implementation, options, profile or mode) is refused unless --overwrite; reruns and shards of the
same run into one folder are one run.

IMPL is `reference` (the float64 reference in profile f64; its precision emulation in f32, bf16,
f16), `triton` (gdncheck.gpu_impl, on GDN_DEVICE), `hf` (Hugging Face transformers' own layer and
cache, the hf extra), `mlx` (Apple MLX's mlx-lm Qwen3.5 layer, the mlx extra), `fla`
(flash-linear-attention's gated delta rule, stage-isolated, the fla extra; --option kernel=...) — an
engine's adapter reports what the engine cannot express not applicable (docs/engines.md) —, or
MODULE:CALLABLE, a factory of the plug-in contract: CALLABLE(cfg, weights, *, profile, strict,
**options) -> implementation (docs/plugins.md)."""


def configure(p: argparse.ArgumentParser) -> None:
    from gdncheck.fixtures.manifest import DEFAULT_DIR

    p.add_argument("impl", metavar="IMPL", help="reference | triton | hf | mlx | fla | MODULE:CALLABLE")
    p.add_argument("--fixtures", default=str(DEFAULT_DIR), help=f"fixture folder (default {DEFAULT_DIR})")
    p.add_argument("--out", required=True, help="folder for the outputs (created; never a fixture suite, inside one "
                                                "or around the one in use)")
    p.add_argument("--profile", required=True, choices=RUN_PROFILES, help="precision profile")
    p.add_argument("--case", action="append", help="only this case (id or id prefix; repeatable)")
    p.add_argument("--tag", action="append", help="only cases with this tag (repeatable)")
    p.add_argument("--shard", help="I/N: every N-th selected case from the I-th (0-based)")
    p.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="passed to the factory (reference: placement=hf|fla|fp32_once|metrale, chunk_size=N)")
    p.add_argument("--stage-isolated", action="store_true",
                   help="run each stage alone from golden inputs (needs run_stage; FORMAT.md §8)")
    p.add_argument("--overwrite", action="store_true",
                   help="remove the outputs files of another run (another implementation, options, profile or mode) "
                        "found in --out, and the verify summaries there, before running; without it such a folder "
                        "is refused (verify never judges a mix of runs)")
    p.add_argument("--world", metavar="N",
                   help="run the sharded cases selected on N ranks started with torch.distributed (gloo on CPUs, "
                        "NCCL where CUDA is), each rank writing CASE.rankR.safetensors (FORMAT.md §7.1); every such "
                        "case's plan must name N ranks (--tag world-N). Without it, sharded cases run rank by rank "
                        "in this process (docs/sharding.md)")
    add_output_arguments(p)


def parse_shard(text):
    if not text:
        return None
    from gdncheck.errors import GDNError

    try:
        i, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise GDNError(f"expected --shard I/N, found {text!r}") from None
    if not 0 <= i < n:
        raise GDNError(f"expected --shard I/N with 0 <= I < N, found {text!r}")
    return i, n


def existing_folder(path, flag: str, what: str):
    """``path`` as a folder that must already exist (an input): a typo is one error naming it, and
    nothing is created."""
    from pathlib import Path

    from gdncheck.errors import GDNError

    p = Path(path)
    if not p.is_dir():
        raise GDNError(f"{flag} {path}: expected {what}, found {'a file' if p.exists() else 'nothing'} there")
    return p


def output_file(path, flag: str):
    """A file a command will write (``--summary``, ``--junit``), checked before anything runs: not a
    folder, not a special file, and its folder is not a file."""
    from pathlib import Path

    from gdncheck.errors import GDNError

    p = Path(path)
    if p.is_dir():
        raise GDNError(f"{flag} {p} is a folder; expected the name of a file to write")
    if p.exists() and not p.is_file():
        raise GDNError(f"{flag} {p} is not a regular file (a device or a pipe); expected the name of a file to write")
    if any(parent.exists() and not parent.is_dir() for parent in p.parents):
        raise GDNError(f"{flag} {p}: a parent of it is a file; expected a path whose folders are folders")
    return p


def run(args: argparse.Namespace) -> int:
    import logging

    from gdncheck.conformance.ports.plugin import parse_options
    from gdncheck.conformance.ports.run import default_command, run_impl
    from gdncheck.env import limit_blas_threads
    from gdncheck.untrusted import safe_text

    limit_blas_threads()
    logging.getLogger("gdncheck").setLevel(logging.ERROR)  # the seq-len reset warning is part of the programs
    options = parse_options(args.option)
    command = default_command(args.impl, args.fixtures, args.out, args.profile, options, args.stage_isolated)
    if args.world is not None:
        from gdncheck.conformance.ports.sharded_run import parse_world

        command += f" --world {parse_world(args.world)}"

    con = Console(args)
    existing_folder(args.fixtures, "--fixtures", "a fixture folder")

    def progress(c):
        line = safe_text(f"{c.status:<8} {c.id}") + (f": {safe_text(c.detail)}" if c.detail else "")
        (con.say if c.status == "skipped" else con.progress)(line)

    rep = run_impl(args.impl, args.fixtures, args.out, args.profile, cases=args.case, tags=args.tag,
                   shard=parse_shard(args.shard), options=options, stage_isolated=args.stage_isolated,
                   command=command, progress=progress, lock=True, overwrite=args.overwrite,
                   world=args.world)
    skipped = rep.skipped
    na = sum(c.status == "not_applicable" for c in rep.cases)
    con.say(safe_text(f"ran {len(rep.cases) - len(skipped)} case(s) with {rep.implementation} ({args.profile}) into "
                      f"{args.out}" + (f"; {na} not applicable" if na else "")
                      + (f"; {len(skipped)} skipped (fixture unusable)" if skipped else "")))
    con.progress(safe_text(f"next: gdncheck verify --fixtures {shlex.quote(args.fixtures)} --outputs "
                           f"{shlex.quote(args.out)} --profile {args.profile if args.profile != 'f64' else 'f32'}"
                           + (" --stage-isolated" if args.stage_isolated else "")))
    return 2 if skipped else 0
