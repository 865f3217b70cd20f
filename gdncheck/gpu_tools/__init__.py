"""The Triton path's tooling, apart from its kernels (``gpu_impl/``): what measures and checks them.

- :mod:`.bench`: the benchmark against the machine's own ceilings (``python -m gdncheck.gpu_tools.bench``,
  ``gdncheck gpu-bench``);
- :mod:`.compile_check`: every launch of the layer built for sm_90 as the JIT builds it, without a GPU;
- :mod:`.gpu_check`: the GPU check of ``scripts/gpu_check.sh`` (versions, the GPU tests, the compile table
  and the benchmark, in one result).

A floor above the Triton path (docs/layout.md): these modules import ``gdncheck.gpu_impl`` and the core,
and nothing of the Triton path imports them.
"""
