"""scripts/bootstrap: the exact install commands it runs (its --print-plan) for a CPU machine, a GPU
runner, an index that answers and one that does not; what the workflow's jobs get from it; and a
resolve of gdncheck's extras in which nothing replaces the pinned torch."""

from __future__ import annotations

import json
import os
import platform
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from . import workflows as wf

BOOTSTRAP = wf.ROOT / "scripts" / "bootstrap"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PIN = "2.13.0"  # README's torch; the venv this suite runs in was made by bootstrap with it


def plan(tmp_path: Path, *args: str, env: dict | None = None, venv: Path | None = None) -> tuple[list[str], list]:
    """(notes, commands) of `bootstrap --print-plan` for a virtual environment not made yet."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("GDN_TORCH_")}
    full.update(env or {})
    venv = venv or tmp_path / "venv"
    out = subprocess.run([sys.executable, str(BOOTSTRAP), "--print-plan", "--venv", str(venv), *args],
                         capture_output=True, text=True, env=full, timeout=60)  # the probe gives up at 10 s
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    return [ln[2:] for ln in lines if ln.startswith("# ")], [shlex.split(ln) for ln in lines if not ln.startswith("#")]


def pip_installs(cmds: list[list[str]]) -> list[list[str]]:
    """The arguments after `-m pip install` of each pip command, in order."""
    return [c[c.index("install") + 1:] for c in cmds if c[1:4] == ["-m", "pip", "install"]]


def torch_reqs(args: list[str]) -> list[str]:
    return [a for a in args if a.startswith("torch")]


def option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


@pytest.fixture
def index_dir(tmp_path) -> str:
    """A local "index" whose torch page answers (the probe reads INDEX/torch/)."""
    (tmp_path / "index" / "torch").mkdir(parents=True)
    return (tmp_path / "index").as_uri()


def test_cpu_from_the_cpu_index(tmp_path, index_dir):
    notes, cmds = plan(tmp_path, env={"GDN_TORCH_VARIANT": "cpu", "GDN_TORCH_INDEX": index_dir})
    assert cmds[0][1:] == ["-m", "venv", str(tmp_path / "venv")]
    torch_step, extras_step, no_deps_step, *_ = pip_installs(cmds)
    # torch alone from that index, the exact CPU build, with bounded network waits
    assert torch_reqs(torch_step) == [f"torch=={PIN}+cpu"]
    assert option(torch_step, "--index-url") == index_dir and "--no-deps" in torch_step
    assert int(option(torch_step, "--timeout")) <= 60 and int(option(torch_step, "--retries")) <= 3
    # then gdncheck's extras with the same exact pin among the requirements
    assert extras_step[extras_step.index("-e") + 1] == ".[triton,dev,hf,mlx,fla,onnxruntime,keras,sglang]"
    assert torch_reqs(extras_step) == [f"torch=={PIN}+cpu"]
    # keras-hub without its dependencies (tensorflow-text), the pin beside it
    assert "--no-deps" in no_deps_step and "keras-hub==0.32.0" in no_deps_step
    assert torch_reqs(no_deps_step) == [f"torch=={PIN}+cpu"]
    # SGLang's wheel alone last, where it has one (its metadata pins a CUDA stack: conformance/engines/sglang/README.md)
    if sys.platform == "linux" and platform.machine() == "x86_64" and sys.version_info[:2] == (3, 11):
        assert pip_installs(cmds)[3:] == [["--disable-pip-version-check", "-q", "--no-deps", "sglang==0.5.23"]]
    else:
        assert len(pip_installs(cmds)) == 3 and any("sglang==0.5.23 not installed" in n for n in notes)
    assert all(c[0] == str(tmp_path / "venv" / "bin" / "python") for c in cmds[1:])
    assert any("cpu" in n and "GDN_TORCH_VARIANT" in n for n in notes)


def test_cpu_without_the_index_takes_pips_own_sources(tmp_path):
    """PyTorch's index does not answer (here: a folder that does not exist; on this machine the real
    host does not resolve): the same exact +cpu pin comes from pip's configured sources, which never
    hold a CUDA build under that name."""
    missing = (tmp_path / "no-such-index").as_uri()
    notes, cmds = plan(tmp_path, env={"GDN_TORCH_VARIANT": "cpu", "GDN_TORCH_INDEX": missing})
    torch_step, extras_step, no_deps_step, *_ = pip_installs(cmds)
    assert torch_reqs(torch_step) == [f"torch=={PIN}+cpu"] and "--index-url" not in torch_step
    assert torch_reqs(extras_step) == [f"torch=={PIN}+cpu"]
    assert any("did not answer" in n and missing in n for n in notes)


def test_an_index_that_never_answers_is_given_up(tmp_path):
    """A server that accepts the connection and never replies (a firewall's black hole looks alike):
    the probe gives up after its limit and the plan falls back, instead of pip waiting on it."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        index = f"http://127.0.0.1:{server.getsockname()[1]}/whl/cpu"
        notes, cmds = plan(tmp_path, env={"GDN_TORCH_VARIANT": "cpu", "GDN_TORCH_INDEX": index})
    assert "--index-url" not in pip_installs(cmds)[0]
    assert any("did not answer within 10 s" in n and index in n for n in notes)


def test_cpu_default_index_is_pytorchs(tmp_path):
    # --no-probe: the plan of a machine that reaches the index (GitHub's hosted runners)
    _, cmds = plan(tmp_path, "--no-probe", env={"GDN_TORCH_VARIANT": "cpu", "GDN_TORCH_VERSION": "2.12.1"})
    torch_step, extras_step, no_deps_step, *_ = pip_installs(cmds)
    assert option(torch_step, "--index-url") == CPU_INDEX
    assert torch_reqs(torch_step) == torch_reqs(extras_step) == ["torch==2.12.1+cpu"]


def test_cuda_takes_pypis_build_with_its_dependencies(tmp_path, index_dir):
    _, cmds = plan(tmp_path, env={"GDN_TORCH_VARIANT": "cuda"})
    torch_step, extras_step, no_deps_step, *_ = pip_installs(cmds)
    assert torch_reqs(torch_step) == torch_reqs(extras_step) == [f"torch=={PIN}"]
    assert "--no-deps" not in torch_step and "--index-url" not in torch_step
    # a CUDA index of PyTorch's when asked
    _, cmds = plan(tmp_path, env={"GDN_TORCH_VARIANT": "cuda", "GDN_TORCH_INDEX": index_dir})
    assert option(pip_installs(cmds)[0], "--index-url") == index_dir


def test_index_none_uses_pips_sources_only(tmp_path):
    notes, cmds = plan(tmp_path, env={"GDN_TORCH_VARIANT": "cpu", "GDN_TORCH_INDEX": "none"})
    torch_step, *_ = pip_installs(cmds)
    assert "--index-url" not in torch_step and torch_reqs(torch_step) == [f"torch=={PIN}+cpu"]
    assert not any("did not answer" in n for n in notes)  # not probed


@pytest.mark.parametrize("smi, variant", [
    ("echo 'GPU 0: NVIDIA H200 (UUID: GPU-5d1f0c2e)'", "cuda"),
    ("echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9", "cpu"),
    (None, "cpu"),
])
def test_auto_variant_follows_nvidia_smi(tmp_path, smi, variant):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if smi is not None:
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\n{smi}\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    # PATH is that folder alone: a real nvidia-smi elsewhere must not count (bootstrap runs nothing
    # else by name; the fake runs under /bin/sh by its absolute path)
    notes, cmds = plan(tmp_path, "--no-probe", env={"PATH": str(bin_dir)})
    want = f"torch=={PIN}+cpu" if variant == "cpu" else f"torch=={PIN}"
    assert torch_reqs(pip_installs(cmds)[0]) == [want]
    assert notes[0].startswith(f"torch variant: {variant} (")


def test_unknown_variant_is_refused(tmp_path):
    env = {**os.environ, "GDN_TORCH_VARIANT": "gpu"}
    out = subprocess.run([sys.executable, str(BOOTSTRAP), "--print-plan", "--venv", str(tmp_path / "v")],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode != 0 and out.stdout == ""
    assert out.stderr.strip() == "bootstrap: GDN_TORCH_VARIANT: expected auto, cpu or cuda, found 'gpu'"


def test_installed_torch_is_kept(tmp_path):
    """In the environment this suite runs in (bootstrap's, torch 2.13.0+cpu), the plan installs no
    torch: only gdncheck with its extras, torch pinned to what is there."""
    import torch

    if torch.__version__ != f"{PIN}+cpu" or not (Path(sys.prefix) / "bin" / "python").exists():
        pytest.skip(f"not bootstrap's CPU environment (torch {torch.__version__}, prefix {sys.prefix})")
    notes, cmds = plan(tmp_path, env={"GDN_TORCH_VARIANT": "cpu"}, venv=Path(sys.prefix))
    # the extras, then keras-hub (--no-deps), each with the pin; SGLang's wheel alone has none
    assert [torch_reqs(a) for a in pip_installs(cmds)][:2] == [[f"torch=={PIN}+cpu"]] * 2
    assert "-e" in pip_installs(cmds)[0]
    assert any("is installed already" in n for n in notes)


def bootstrap_jobs():
    for fname, workflow in wf.load_all().items():
        for name, job in workflow["jobs"].items():
            for step in job.get("steps", []):
                if "scripts/bootstrap" in (step.get("run") or ""):
                    yield pytest.param(workflow, job, step, id=f"{fname}:{name}")


@pytest.mark.parametrize("workflow, job, step", list(bootstrap_jobs()))
def test_workflow_jobs_get_the_right_torch(tmp_path, workflow, job, step):
    """What each workflow job's bootstrap installs, with the job's environment, on a runner that
    reaches PyTorch's index: the hosted (CPU) jobs the CPU build from the CPU index, never a CUDA
    build; the self-hosted GPU jobs the CUDA build."""
    env = {k: str(v) for k, v in wf.step_env(workflow, job, step).items() if k.startswith("GDN_TORCH_")}
    _, cmds = plan(tmp_path, "--no-probe", env=env)
    steps = pip_installs(cmds)
    reqs = [r for s in steps for r in torch_reqs(s)]
    if wf.self_hosted(job):
        assert env.get("GDN_TORCH_VARIANT") == "cuda" and reqs == [f"torch=={PIN}"] * 3
    else:
        assert env.get("GDN_TORCH_VARIANT") == "cpu"
        assert reqs == [f"torch=={PIN}+cpu"] * 3 and option(steps[0], "--index-url") == CPU_INDEX
        # and no other step of the job installs anything that could bring a torch of its own
        for other in job["steps"]:
            for line in (other.get("run") or "").splitlines():
                if "pip install" in line:
                    pkgs = [a for a in shlex.split(line)[shlex.split(line).index("install") + 1:]
                            if not a.startswith("-")]
                    assert all("==" in p and not p.startswith("torch") for p in pkgs), line


def test_extras_resolve_keeps_the_pinned_torch(tmp_path):
    """pip resolves gdncheck's requirements and the triton, dev and hf extras with the torch pin,
    offline (--no-index) against what is installed here: the resolve must succeed and install
    nothing, so no extra asks for another torch (it would be a conflict, or a torch to install)."""
    tomllib = pytest.importorskip("tomllib")
    import torch

    project = tomllib.loads((wf.ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in ("triton", "dev", "hf"):
        reqs += project["optional-dependencies"][extra]
    pin = f"torch=={torch.__version__}"
    report = tmp_path / "report.json"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--quiet",
                          "--disable-pip-version-check", "--report", str(report), *reqs, pin],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (f"the extras do not resolve with {pin} and what is installed "
                                 f"(re-run scripts/bootstrap after changing pyproject.toml):\n{out.stderr[-3000:]}")
    to_install = [(i["metadata"]["name"], i["metadata"]["version"]) for i in json.loads(report.read_text())["install"]]
    assert to_install == [], f"the resolve would install {to_install}"
