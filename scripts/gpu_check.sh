#!/usr/bin/env bash
# The Triton path on a CUDA GPU, in one command and one result: the versions found, the gpu_impl
# tests compiled on CUDA, the compile table (gdncheck.gpu_tools.compile_check) and the benchmark
# (gdncheck.gpu_tools.bench), written as gpu-check.json + gpu-check.md (gdncheck.gpu_tools.gpu_check).
# Installs nothing: it runs under the machine's own Python and packages, whatever their versions
# (a GPU runner's pins may differ from ours; the result lists what it found).
#
#   scripts/gpu_check.sh                 # on a GPU machine: results in $OUT, else ./gpu-check-out
#   scripts/gpu_check.sh --full-compile  # the compile table's full plan (default: --quick)
#   scripts/gpu_check.sh --dry-run       # the same steps on the CPU at tiny sizes (CI runs this)
#
# Python: $PYTHON, else .venv/bin/python when it sees the device, else python3 (on a device
# machine, the image's python3 holds a CUDA torch). Exit 0 when the result's status is pass.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DRY=0
ARGS=()
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1; ARGS+=(--dry-run) ;;
    --full-compile) ARGS+=(--full-compile) ;;
    *) echo "usage: scripts/gpu_check.sh [--dry-run] [--full-compile]" >&2; exit 2 ;;
  esac
done
OUT_DIR=${OUT:-$ROOT/gpu-check-out}

has_cuda() { "$1" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; }
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in "$ROOT/.venv/bin/python" python3; do
    command -v "$cand" >/dev/null 2>&1 || [ -x "$cand" ] || continue
    if [ "$DRY" = 1 ] || has_cuda "$cand"; then PY=$cand; break; fi
  done
fi
if [ -z "$PY" ]; then echo "gpu_check: no python with a CUDA torch found (set PYTHON=...)" >&2; exit 2; fi

# gdncheck maps top-level folders onto sub-packages (pyproject package-dir). Without an install,
# mirror that with links in a temporary folder, and run from there: from the repository root,
# its plain gdncheck/ folder would shadow the links (pytest puts the root first on sys.path,
# hence --import-mode=append).
RUN_DIR=$ROOT
PYTEST_ARGS=()
if ! (cd /tmp && "$PY" -c "import gdncheck.gpu_impl, sys; sys.exit(0 if gdncheck.__file__.startswith('$ROOT/') else 1)" 2>/dev/null); then
  SITE=$(mktemp -d)
  mkdir "$SITE/gdncheck"
  for f in gdncheck/*; do ln -s "$ROOT/$f" "$SITE/gdncheck/"; done
  for sub in reference gpu_impl conformance fixtures reports gate; do ln -s "$ROOT/$sub" "$SITE/gdncheck/$sub"; done
  export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  RUN_DIR=$SITE
  PYTEST_ARGS=(--rootdir "$ROOT" -c "$ROOT/pyproject.toml" --import-mode=append)
  echo "gpu_check: gdncheck from $ROOT through links in $SITE"
fi
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1 TRITON_DEFAULT_FP_FUSION=${TRITON_DEFAULT_FP_FUSION:-1}
if [ "$DRY" = 1 ]; then
  export GDN_DEVICE=cpu
  TESTS=("$ROOT/tests/gpu_impl/test_layer.py" "$ROOT/tests/gpu_impl/test_serving.py"
         "$ROOT/tests/gpu_impl/test_large_index.py" -k
         "(test_segments_against_reference and Hk2_Hv4_dk16_dv8-f32) or (test_decode_batch_with_slot_indices and f32) or large_index"
         -p no:xdist)
else
  export GDN_DEVICE=cuda
  workers=$(( $(nproc) > 8 ? 8 : $(nproc) ))
  XDIST=()
  "$PY" -c "import xdist" 2>/dev/null && XDIST=(-n "$workers")
  # the Triton path and its tooling, and the built-in triton port's stage runner on it (a test of the ports' floor)
  TESTS=("$ROOT/tests/gpu_impl" "$ROOT/tests/gpu_tools" "$ROOT/tests/ports/test_triton_moe_stages.py" "${XDIST[@]}")
fi
(cd "$RUN_DIR" && "$PY" -m gdncheck.gpu_tools.gpu_check --out "$OUT_DIR" "${ARGS[@]}" -- \
  "${PYTEST_ARGS[@]}" "${TESTS[@]}")
status=$?
[ -f "$OUT_DIR/gpu-check.md" ] && sed -n '1,40p' "$OUT_DIR/gpu-check.md"
exit "$status"
