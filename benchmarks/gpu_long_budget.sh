#!/usr/bin/env bash
# The long-budget saving on a GPU, in one lease: a GPT of about 1M parameters (8 layers, 2 heads x 48, 3.7x the CPU
# benchmark's 270k) on the docs+gcide token file (31.0M tokens at vocabulary 1,024, 29.4M of them trained on), bf16,
# WSD, read by the same benchmark (`benchmarks.saving`) as the CPU figures. T=1280 steps of 128 x 128 tokens is 21
# tokens per parameter and 0.71 epochs; the frontier's scratch budgets go from 500 to 3200 steps (0.28 to 1.78
# epochs). Runs are ordered by what they decide, and each one that would start past the deadline is skipped, so the
# lease always ends with the files written so far:
#   A  scratch at T, StackBERT with long shallow stages and halved copies (GPT's long-budget recipe), StackBERT
#   B  scratch at 2000 and 800 (the frontier around T)
#   C  benchmarks.gpu part 1: GPT-2 124M train-step throughput and MFU, big and coalesced small model
#   D  MSG and the planner's depth-only schedule at T (scratch reused from A)
#   E  scratch at T with peak lr 6e-3 and F with 1.5e-3 (is 3e-3 a fair scratch rate?)
#   G  scratch at 500 and 3200 (five frontier points for the fit)
#
# 1. Here, once (needs the corpora: apt-get install dict-gcide linux-source-6.12 python3.11-doc; about 2 minutes):
#      bash benchmarks/gpu_long_budget.sh prepare
#    builds the token file, packs it xz-compressed (17 MB) into .gpudata/tok and the wheels the device image may lack
#    into .whl (both ignored by git through .git/info/exclude).
# 2. On the device (the repo's root; carry .gpudata and .whl; timeout_s 600):
#      bash benchmarks/gpu_long_budget.sh run .gpudata/tok $OUT 540
#    CPU wiring check (tiny budgets, part 1 in --smoke mode; about 15 minutes on 2 cores):
#      SMOKE=1 PYTHON=.venv/bin/python bash benchmarks/gpu_long_budget.sh run .gpudata/tok /tmp/gpu-smoke 900
# 3. Read the files with benchmarks.analyze_saving: A.json B.json D.json G.json
#    --frontier=A.json,B.json,E.json,F.json,G.json --frontier_best --fit.
set -u
MODE=${1:?usage: gpu_long_budget.sh prepare | run TOKEN_DIR OUT_DIR [DEADLINE_S]}
shift
if [ "$MODE" = prepare ]; then
  PY=${PYTHON:-.venv/bin/python}
  tmp=$(mktemp -d)
  "$PY" -m experiments.build_tokens --config=experiments/configs/gpt.py:tiny --config.data.name=docs+gcide \
    --config.data.vocab_size=1024 --config.model.max_len=128 --config.train.batch_size=128 \
    --steps=500,800,1280,2000,3200 --out="$tmp/tok" || exit 1
  rm -rf .gpudata/tok && mkdir -p .gpudata/tok
  cp "$tmp"/tok/index.bin "$tmp"/tok/meta.json "$tmp"/tok/tokenizer.json .gpudata/tok/
  xz -T0 -6 -c "$tmp/tok/tokens.bin" > .gpudata/tok/tokens.bin.xz || exit 1
  rm -rf "$tmp"
  # Pure-Python wheels at the versions installed here: what the image lacks, and a tested fallback set.
  version() { "$PY" -m pip show "$1" 2>/dev/null | awk '/^Version/{print $2}'; }
  get() {
    local dir=$1; shift
    local specs=() n
    for n in "$@"; do specs+=("$n==$(version "$n")"); done
    rm -rf "$dir" && "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform any --platform manylinux_2_17_x86_64 -d "$dir" "${specs[@]}" || exit 1
  }
  get .whl/base ml_collections tensorboardX
  get .whl/fallback flax optax orbax-checkpoint chex
  for d in /.gpudata/ /.whl/; do grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
  du -sh .gpudata .whl
  exit 0
fi
[ "$MODE" = run ] || { echo "unknown mode $MODE: prepare or run" >&2; exit 2; }
TOKSRC=${1:?token file folder (tokens.bin or tokens.bin.xz, index.bin, meta.json, tokenizer.json)}
OUT=${2:?output folder}
DEADLINE=${3:-540}
PY=${PYTHON:-python3}
START=$(date +%s)
mkdir -p "$OUT"
LOG=$OUT/log.txt
export PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/multilevel-jax-cache}
say() { echo "[$(( $(date +%s) - START )) s] $*" | tee -a "$LOG"; }
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }

# The token file: decompressed next to nothing else (a run opens it by path and checks its CRCs).
TOK=/tmp/multilevel-tok
rm -rf "$TOK" && mkdir -p "$TOK"
cp "$TOKSRC"/index.bin "$TOKSRC"/meta.json "$TOKSRC"/tokenizer.json "$TOK"/
if [ -f "$TOKSRC/tokens.bin.xz" ]; then
  "$PY" -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'), 1 << 24)" \
    "$TOKSRC/tokens.bin.xz" "$TOK/tokens.bin" || { say "could not decompress the token file"; exit 1; }
else
  cp "$TOKSRC/tokens.bin" "$TOK/"
fi
# Packages the device image may lack (wheels in .whl/base), and a fallback set of the versions tested here.
if ls .whl/base/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/base/*.whl \
    >>"$LOG" 2>&1 && export PYTHONPATH=/tmp/site
fi
"$PY" - <<'EOF' 2>&1 | tee -a "$LOG"
import importlib, jax
print("jax", jax.__version__, jax.default_backend(), jax.devices())
for m in ("flax", "optax", "orbax.checkpoint", "chex", "ml_collections", "tokenizers", "numpy"):
  try:
    print(m, getattr(importlib.import_module(m), "__version__", "?"))
  except Exception as e:
    print(m, "MISSING", e)
EOF
nvidia-smi -L 2>&1 | tee -a "$LOG"

if [ "${SMOKE:-0}" = 1 ]; then
  T=24; B2=36; B1=16; B0=10; B3=60; P1=(--smoke)
else
  T=1280; B2=2000; B1=800; B0=500; B3=3200; P1=()
fi
COMMON=(--family=gpt --set=model.num_layers=8 --set=model.num_heads=2 --set=model.head_dim=48
        --set=train.batch_size=128 --set=data.token_file=$TOK --set=train.decay=wsd --set=model.dtype=bfloat16)

bench() {  # bench NAME LR ARGS...: one benchmarks.saving invocation, skipped or cut at the deadline.
  local name=$1 lr=$2; shift 2
  local l; l=$(left)
  if [ "$l" -lt 40 ]; then say "$name: skipped ($l s left)"; return 9; fi
  say "$name: start ($*) lr $lr"
  timeout "$l" "$PY" -m benchmarks.saving "${COMMON[@]}" --set=train.lr=$lr "$@" --workroot=/tmp/mlb-$name \
    --out="$OUT/$name.json" >>"$LOG" 2>&1
  local rc=$?
  say "$name: rc $rc"
  return $rc
}

bench A 3e-3 --budgets=$T --variants=stackbert_long_scaled,stackbert
rc=$?
if [ $rc -ne 0 ] && [ -d .whl/fallback ] && [ "$(left)" -gt 200 ]; then
  say "A failed: retrying with the fallback packages (flax, optax, orbax-checkpoint, chex as tested on the CPU)"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/fallback/*.whl >>"$LOG" 2>&1 && export PYTHONPATH=/tmp/site
  bench A 3e-3 --budgets=$T --variants=stackbert_long_scaled,stackbert
  rc=$?
fi
[ $rc -eq 0 ] || { say "A failed; stopping"; tail -40 "$LOG"; exit 1; }
bench B 3e-3 --budgets=$B2,$B1 --variants=
l=$(left)
if [ "$l" -ge 60 ]; then
  say "C: benchmarks.gpu part 1"
  timeout "$l" "$PY" -m benchmarks.gpu --skip_cycle "${P1[@]}" --workroot=/tmp/mlb-gpu --out="$OUT/C_throughput.json" \
    >>"$LOG" 2>&1
  say "C: rc $?"
fi
bench D 3e-3 --budgets=$T --variants=msg,depth_only_fresh --scratch_from="$OUT/A.json"
bench E 6e-3 --budgets=$T --variants=
bench F 1.5e-3 --budgets=$T --variants=
bench G 3e-3 --budgets=$B0,$B3 --variants=
say "done"
grep -E "budget [0-9]+ |FLOPs saving|MFU|tokens/s|Step-time" "$LOG" | tail -40
