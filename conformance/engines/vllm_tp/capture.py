"""vLLM's whole engine at tensor parallel 1 and 2, its GDN layer captured rank by rank (the program of the row
``vllm-tp``, run by the python of vLLM's own environment; docs: ``conformance/engines/vllm_tp/README.md``).

    .venv-vllm/bin/python -m gdncheck.conformance.engines.vllm_tp.capture --fixtures DIR --out DIR [--tp 1 2]

For each tensor-parallel size it writes a checkpoint made from a real-size case's weights (:data:`CASE`: the
layer as block 0 of a two-block ``Qwen3_5ForCausalLM``), starts ``vllm.LLM`` on it (``distributed_executor_backend
="mp"``, ``enforce_eager``; chunked prefill with a small token budget, so its scheduler splits a long prompt and
batches decodes with prefill chunks), installs hooks in every worker (``llm.collective_rpc``) and generates
greedily for a few requests. Per rank and per forward the hooks keep what vLLM's GDN module
(``QwenGatedDeltaNetAttention.forward_cpu``) sees and makes, rank-local: its input hidden states, the
``in_proj_qkvz`` and ``in_proj_ba`` outputs, the core before the gated norm, the conv and recurrent state of each
slot the forward touches before and after it, the ``out_proj`` partial before the all-reduce (recomputed with
``out_proj.quant_method.apply``: the CPU build prepacks its weights) and the all-reduced output; and the batch:
the requests in batch order, their token ranges, slots, ``has_initial_state``. Each rank writes
``tp{N}.rank{r}.safetensors`` (the tensors, float32, exact for vLLM's bf16) with the batch as JSON in its
metadata; ``tp{N}.json`` says the run (requests, greedy tokens, seconds). :mod:`.judge` judges them in float64.

Imports vLLM inside functions only; the shared-memory segments (``/dev/shm/vllm_dist_*``) a run made are
deleted after it (only those: the ones that were not there before it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

#: the real-size case whose weights the checkpoint holds (Qwen3.5's head counts and dims: Hk 16, Hv 32, 128)
CASE = "real-heads_T3_Hk16_Hv32_dk128_dv128_s0"
#: the case whose key head 1 has q and k of squared norm ~1e-6, the L2 norm's eps (Hk 2, Hv 2, 128)
EPS_CASE = "d128-qk-eps_T8_Hk2_Hv2_dk128_dv128_s0"
#: the row's runs: (name, fixture case, tensor-parallel sizes); files ``{name}.tp{N}.*``
RUNS = (("real-heads", CASE, (1, 2)), ("d128-qk-eps", EPS_CASE, (2,)))
#: the requests: prompt lengths (the long ones are prefilled in chunks of BUDGET tokens) and tokens generated
PROMPTS = (40, 7, 70)
MAX_TOKENS = 4
#: the scheduler's token budget per step (max_num_batched_tokens): a 70-token prompt takes three chunks
BUDGET = 32
VOCAB = 64
#: block 1, the full-attention block, all zeros (its output never reaches the GDN layer of block 0)
ATTN_HEADS, ATTN_HEAD_DIM = 2, 128
#: captured per rank and forward (rank-local; the states per touched slot)
TENSORS = ("x", "qkvz", "ba", "core", "z", "core_gated", "partial", "out", "conv_before", "ssm_before", "conv_after",
           "ssm_after")


def engine_weights(weights) -> dict[str, np.ndarray]:
    """The layer's weights as the checkpoint stores them and vLLM holds them: bf16, but ``A_log`` float32
    (vLLM's parameter is float32); as float64 arrays (exact)."""
    out = {}
    for name, w in weights.items():
        a = np.asarray(w, dtype=np.float32)
        if name != "linear_attn.A_log":
            a = _bf16(a)
        out[name] = a.astype(np.float64)
    return out


def _bf16(a: np.ndarray) -> np.ndarray:
    """float32 rounded to the nearest bf16, ties to even (as torch's ``.to(torch.bfloat16)``)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def case_weights(fixtures: Path, case: str = CASE):
    """(config, the case's weights as vLLM holds them) from a fixture suite."""
    from gdncheck.config import GDNConfig
    from gdncheck.errors import GDNError
    from gdncheck.fixtures.manifest import case_file, load_manifest
    from gdncheck.safetensors_io import SafetensorsFile

    manifest = load_manifest(fixtures, [])
    entry = next((e for e in manifest["cases"] if e["id"] == case), None)
    if entry is None:
        raise GDNError(f"expected the case {case} in the fixture suite {fixtures}, found none (the row vllm-tp "
                       f"makes its checkpoint from that case's weights)")
    f = SafetensorsFile(case_file(fixtures, entry))
    weights = {n[len("weights."):]: f[n] for n in f.keys() if n.startswith("weights.")}
    return GDNConfig.from_hf(dict(entry["config"])), engine_weights(weights)


def write_checkpoint(directory: Path, cfg, weights) -> Path:
    """The layer as block 0 of a two-block ``Qwen3_5ForCausalLM`` (bf16; A_log float32), block 1 a
    full-attention block of zeros, a small embedding (tied) and a final norm."""
    from gdncheck.safetensors_io import write_safetensors
    from gdncheck.synthetic import write_hf_checkpoint

    D = cfg.hidden_size
    inter = weights["mlp.gate_proj.weight"].shape[0]
    nh, hd = ATTN_HEADS, ATTN_HEAD_DIM
    shapes = {"self_attn.q_proj.weight": (2 * nh * hd, D), "self_attn.k_proj.weight": (nh * hd, D),
              "self_attn.v_proj.weight": (nh * hd, D), "self_attn.o_proj.weight": (D, nh * hd),
              "self_attn.q_norm.weight": (hd,), "self_attn.k_norm.weight": (hd,), "input_layernorm.weight": (D,),
              "post_attention_layernorm.weight": (D,), "mlp.gate_proj.weight": (inter, D),
              "mlp.up_proj.weight": (inter, D), "mlp.down_proj.weight": (D, inter)}
    attn = {n: np.zeros(s, dtype=np.float32) for n, s in shapes.items()}
    arrays = {n: np.asarray(w, dtype=np.float32) for n, w in weights.items()}
    dtypes = {n: "BF16" for n in [*arrays, *attn]}
    dtypes["linear_attn.A_log"] = "F32"
    extra = {"architectures": ["Qwen3_5ForCausalLM"], "vocab_size": VOCAB, "tie_word_embeddings": True,
             "layer_types": ["linear_attention", "full_attention"], "num_attention_heads": nh,
             "num_key_value_heads": nh, "head_dim": hd, "max_position_embeddings": 4096,
             "full_attention_interval": 2, "hidden_act": "silu", "torch_dtype": "bfloat16",
             "mamba_ssm_dtype": "float32"}
    write_hf_checkpoint(directory, cfg, {0: arrays, 1: attn}, num_layers=2, prefix="model.layers.{i}.",
                        dtypes=dtypes, extra_config=extra)
    rng = np.random.default_rng(0)
    embed = _bf16((rng.standard_normal((VOCAB, D)) * 0.5).astype(np.float32))
    write_safetensors(directory / "model-extra.safetensors",
                      {"model.embed_tokens.weight": embed, "model.norm.weight": np.zeros(D, dtype=np.float32)},
                      {"format": "pt"}, dtypes={"model.embed_tokens.weight": "BF16", "model.norm.weight": "BF16"})
    return directory


def prompts(seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, VOCAB, size=n).tolist() for n in PROMPTS]


# --- in every worker (``llm.collective_rpc``) -----------------------------------------------------------


def _gdn_modules(worker):
    model = worker.model_runner.get_model() if hasattr(worker.model_runner, "get_model") else worker.model_runner.model
    return [m for m in model.modules() if type(m).__name__ == "QwenGatedDeltaNetAttention"]


def install_hooks(worker) -> int:
    """Hooks on the first GDN module of this worker's model; the captures go to ``worker._gdn_capture``."""
    import torch
    from vllm.distributed import get_tensor_model_parallel_rank
    from vllm.forward_context import get_forward_context

    layer = _gdn_modules(worker)[0]
    worker._gdn_capture = store = []
    current: dict = {}

    def f32(t):
        return t.detach().to(torch.float32).cpu().numpy().copy()

    def batch_of():
        ctx = get_forward_context()
        md = ctx.attn_metadata
        if not isinstance(md, dict) or layer.prefix not in md:
            return None
        m = md[layer.prefix]
        n_req = m.num_decodes + m.num_prefills
        if m.num_actual_tokens == 0 or m.num_spec_decodes or n_req == 0:
            return None
        ids = list(worker.model_runner.input_batch.req_ids[:n_req])
        has = m.has_initial_state
        return {"req_ids": ids, "num_tokens": int(m.num_actual_tokens), "num_decodes": int(m.num_decodes),
                "query_start_loc": m.non_spec_query_start_loc[: n_req + 1].tolist(),
                "slots": m.non_spec_state_indices_tensor[:n_req].tolist(),
                "has_initial_state": None if has is None else [bool(x) for x in has.tolist()]}

    def states(slots):
        conv, ssm = layer.kv_cache[0], layer.kv_cache[1]
        idx = torch.tensor(slots, dtype=torch.long)
        return f32(conv[idx]), f32(ssm[idx])

    def pre_qkvz(mod, args):
        batch = batch_of()
        current.clear()
        if batch is None:
            return
        n = batch["num_tokens"]
        current.update(batch=batch, x=f32(args[0][:n]))
        current["conv_before"], current["ssm_before"] = states(batch["slots"])

    def post(name):
        def hook(mod, args, output):
            if current:
                out = output[0] if isinstance(output, tuple) else output
                current[name] = f32(out[: current["batch"]["num_tokens"]])
        return hook

    def pre_norm(mod, args):
        if current:
            n = current["batch"]["num_tokens"]
            current["core"], current["z"] = f32(args[0][:n]), f32(args[1][:n])
            current["conv_after"], current["ssm_after"] = states(current["batch"]["slots"])

    def pre_out(mod, args):
        if current:
            n = current["batch"]["num_tokens"]
            with torch.no_grad():
                current["partial"] = f32(mod.quant_method.apply(mod, args[0])[:n])

    def post_out(mod, args, output):
        if current:
            current["out"] = f32(output[0][: current["batch"]["num_tokens"]])
            store.append(dict(current))
            current.clear()

    layer.in_proj_qkvz.register_forward_pre_hook(pre_qkvz)
    layer.in_proj_qkvz.register_forward_hook(post("qkvz"))
    layer.in_proj_ba.register_forward_hook(post("ba"))
    layer.norm.register_forward_pre_hook(pre_norm)
    layer.norm.register_forward_hook(post("core_gated"))
    layer.out_proj.register_forward_pre_hook(pre_out)
    layer.out_proj.register_forward_hook(post_out)
    return get_tensor_model_parallel_rank()


def save_captures(worker, out: str, tp: int, name: str) -> str:
    """Write this worker's captures to ``{out}/{name}.tp{tp}.rank{r}.safetensors``; its path."""
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    from gdncheck.safetensors_io import write_safetensors

    rank = get_tensor_model_parallel_rank()
    layer = _gdn_modules(worker)[0]
    tensors, batches = {}, []
    for i, cap in enumerate(worker._gdn_capture):
        batches.append(cap["batch"])
        for what in TENSORS:
            if what in cap:
                tensors[f"forward.{i}.{what}"] = np.ascontiguousarray(cap[what], dtype=np.float32)
    meta = {"rank": rank, "world": get_tensor_model_parallel_world_size(), "batches": batches,
            "conv_layout": "slot, K-1, q_r|k_r|v_r", "ssm_layout": list(map(int, layer.kv_cache[1].shape[1:])),
            "ssm_dtype": str(layer.kv_cache[1].dtype), "prefix": layer.prefix}
    path = Path(out) / f"{name}.tp{tp}.rank{rank}.safetensors"
    write_safetensors(path, tensors, {"format": "pt", "gdncheck_vllm_tp": json.dumps(meta)})
    return str(path)


# --- the driver ------------------------------------------------------------------------------------

#: a stand-in for torchvision, put on the path of the run (and its processes) where torchvision is missing:
#: ``scripts/engine-env vllm`` removes PyPI's torchvision (its compiled ops do not load with torch +cpu), and
#: vLLM's ``qwen3_5`` module imports ``qwen3_vl``, which imports transformers' Qwen2-VL image processor, which
#: imports torchvision at its top; the text-only path never calls it
TORCHVISION_STAND_IN = '''\
"""A stand-in for torchvision (gdncheck's vllm-tp row): vLLM's Qwen3.5 module imports transformers'
Qwen2-VL image processor, which imports torchvision at its top; the text-only GDN path never calls it. Every
``torchvision.*`` module is a stand-in whose every attribute is a placeholder that raises when called."""
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0"


class _Missing:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __call__(self, *a, **k):
        raise RuntimeError(f"{self._name}: torchvision is not installed (a stand-in of gdncheck's vllm-tp row)")

    def __mro_entries__(self, bases):
        return (object,)


class _Module(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _Module(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
__getattr__ = _Module.__getattr__.__get__(sys.modules[__name__])
'''


def stand_in_torchvision(folder: Path) -> str | None:
    """Where torchvision cannot be found, write the stand-in under ``folder`` and put it on this process's path
    and on PYTHONPATH (vLLM's workers, engine core and model-inspection subprocess inherit it); its folder."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        return None
    pkg = folder / "torchvision"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(TORCHVISION_STAND_IN)
    sys.path.insert(0, str(folder))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(folder), *filter(None, [os.environ.get("PYTHONPATH")])])
    return str(folder)



def _shm() -> set[str]:
    try:
        return {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith("vllm_dist_")}
    except OSError:
        return set()


def run_tp(tp: int, ckpt: Path, out: Path, name: str) -> dict:
    """One engine start at tensor parallel ``tp``: generate, save every rank's captures; what it did."""
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(r % max(os.cpu_count() or 1, 1)) for r in range(tp))
    from vllm import LLM, SamplingParams

    before, t0 = _shm(), time.perf_counter()
    llm = LLM(str(ckpt), tensor_parallel_size=tp, distributed_executor_backend="mp", enforce_eager=True,
              skip_tokenizer_init=True, dtype="bfloat16", max_model_len=256, max_num_batched_tokens=BUDGET,
              max_num_seqs=4, enable_chunked_prefill=True, enable_prefix_caching=False, seed=0)
    try:
        started = time.perf_counter() - t0
        ranks = llm.collective_rpc(install_hooks)
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts()], params, use_tqdm=False)
        files = llm.collective_rpc(save_captures, args=(str(out), tp, name))
        result = {"tp": tp, "vllm": vllm_version(), "ranks": ranks, "files": [Path(f).name for f in files],
                  "start_seconds": round(started, 1),
                  "requests": [{"request_id": o.request_id, "prompt": list(o.prompt_token_ids),
                                "tokens": list(o.outputs[0].token_ids)} for o in outs]}
    finally:
        del llm
        import gc

        gc.collect()
        deleted = []
        for name in sorted(_shm() - before):  # only the segments this run made
            try:
                size = os.stat(f"/dev/shm/{name}").st_size
                os.unlink(f"/dev/shm/{name}")
                deleted.append([name, size])
            except OSError:
                pass
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["shm_deleted"] = deleted
    return result


def vllm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm-cpu")
    except PackageNotFoundError:
        return "?"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fixtures", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--tp", type=int, nargs="+", default=None, choices=(1, 2),
                   help="the tensor-parallel sizes (default: each run's, RUNS)")
    p.add_argument("--case", action="append", default=[],
                   help="a case id prefix: only the runs of the cases it selects (gdncheck engines hands its "
                        "--case on); default every run")
    args = p.parse_args(argv)
    from gdncheck.errors import GDNError
    from gdncheck.fixtures.manifest import refuse_output_in_suite

    runs = selected(args.case)
    try:
        refuse_output_in_suite(args.out, args.fixtures)
        layers = {name: case_weights(args.fixtures, case) for name, case, _ in runs}
        if args.out.exists() and not args.out.is_dir():
            raise GDNError(f"expected --out a folder, found a file {args.out}")
    except GDNError as exc:
        print(f"vllm-tp: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    stand_in_torchvision(args.out / "stand-in")
    for name, _, tps in runs:
        ckpt = write_checkpoint(args.out / f"{name}.checkpoint", *layers[name])
        for tp in args.tp or tps:
            result = run_tp(tp, ckpt, args.out, name)
            (args.out / f"{name}.tp{tp}.json").write_text(json.dumps(result, indent=1) + "\n")
            print(f"vllm-tp: {name} TP {tp}: {len(result['requests'])} requests, start {result['start_seconds']} s, "
                  f"{result['seconds']} s", flush=True)
    return 0


def selected(cases) -> tuple:
    """The runs of :data:`RUNS` whose fixture case a case id prefix of ``cases`` selects (none: every run)."""
    return tuple(r for r in RUNS if not cases or any(r[1].startswith(c) for c in cases))


if __name__ == "__main__":
    sys.exit(main())
