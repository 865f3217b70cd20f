#!/usr/bin/env bash
# The Triton path on a CUDA GPU, in one command: the gpu_impl conformance tests compiled on CUDA,
# then the benchmark table (python -m gdncheck.gpu_impl.bench). Installs nothing.
#
#   scripts/gpu_check.sh            # on a GPU machine (under 5 minutes on one H200)
#   scripts/gpu_check.sh --dry-run  # the same steps on the CPU interpreter at tiny sizes (CI runs this)
#
# Python: $PYTHON, else .venv/bin/python when it sees the device, else python3 (on the device
# machine, the image's python3 holds a CUDA torch). No install is needed (see below). Time limits:
# tests 190 s, benchmark 90 s. The JSON of the benchmark goes to $OUT/bench.json when $OUT is set.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DRY=0
case "${1:-}" in
  --dry-run) DRY=1 ;;
  "") ;;
  *) echo "usage: scripts/gpu_check.sh [--dry-run]" >&2; exit 2 ;;
esac

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
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
(cd "$RUN_DIR" && "$PY" -c "
import sys, torch, triton, gdncheck.gpu_impl as g
print('gpu_check:', 'dry run |' if $DRY else '', 'python', sys.version.split()[0], '| torch', torch.__version__,
      '| triton', triton.__version__, '| cuda:', torch.cuda.is_available() and torch.cuda.get_device_name(0),
      '| gdncheck.gpu_impl from', g.__path__[0])")

status=0
if [ "$DRY" = 1 ]; then
  export GDN_DEVICE=cpu
  TESTS=("$ROOT/tests/gpu_impl/test_layer.py" -k "test_segments_against_reference and Hk2_Hv4_dk16_dv8-f32" -p no:xdist)
  BENCH=(--dry-run)
  T_TESTS=240 T_BENCH=120
else
  export GDN_DEVICE=cuda
  workers=$(( $(nproc) > 8 ? 8 : $(nproc) ))
  XDIST=()
  "$PY" -c "import xdist" 2>/dev/null && XDIST=(-n "$workers")
  TESTS=("$ROOT/tests/gpu_impl" "${XDIST[@]}")
  BENCH=()
  T_TESTS=190 T_BENCH=90
fi
[ -n "${OUT:-}" ] && BENCH+=(--json "$OUT/bench.json")

echo "== 1/2 conformance tests (GDN_DEVICE=$GDN_DEVICE) =="
t0=$(date +%s)
(cd "$RUN_DIR" && timeout "$T_TESTS" "$PY" -m pytest -q -p no:cacheprovider "${PYTEST_ARGS[@]}" "${TESTS[@]}") || status=1
echo "tests: $(( $(date +%s) - t0 )) s"

echo "== 2/2 benchmark =="
t0=$(date +%s)
(cd "$RUN_DIR" && timeout "$T_BENCH" "$PY" -m gdncheck.gpu_impl.bench "${BENCH[@]}") || status=1
echo "benchmark: $(( $(date +%s) - t0 )) s"
[ "$status" = 0 ] && echo "gpu_check: OK" || echo "gpu_check: FAILED (see above)"
exit "$status"
