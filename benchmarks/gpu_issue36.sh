#!/usr/bin/env bash
# The GPU runs of issue 36, as they were run on the lent accelerator (one H100), from the repository root:
#
#   bash benchmarks/gpu_issue36.sh bench   # FlexAttention vs SDPA with a materialised bias vs eager (bench_flex.py)
#   bash benchmarks/gpu_issue36.sh grid    # CUDA FlexAttention tests + the CoLA grid (none, tisa fit, composite)
#
# Environment: PYTHON (default python3), GLUE (a folder with cola/train.jsonl and cola/validation.jsonl),
# OUT (where results are copied; default ./gpu-out), GRID_LRS (default "1e-4 3e-4"); SEEDS (5), EPOCHS (3) and
# GRID_EXTRA (e.g. "--max-train-samples 32") only for a smoke test on the CPU.
# The grid: MiniLM (packaged), CoLA, 3 epochs, batch 32, 5 seeds, each mechanism a separate process writing one
# cell of the grid folder (the cells are ordinary run folders), then `finetune --resume` on the grid folder reads
# the finished cells back and writes the paired summary (SPEC §12). Every cell is `--resume`-able.
set -euo pipefail
PYTHON=${PYTHON:-python3}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
case "${1:-}" in
bench)
  "$PYTHON" benchmarks/bench_flex.py --batch 8 --layers 4 --lengths 512,1024,2048,4096 \
    --mechanisms tisa,composite --steps 5 --warmup 2 --out "$OUT/bench_flex.json" | tee "$OUT/bench_flex.md"
  ;;
grid)
  : "${GLUE:?set GLUE to a folder holding cola/train.jsonl and cola/validation.jsonl}"
  POSPROBE_FLEX_REPORT="$OUT/flex_tests.json" "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_flex_cuda.py \
    > "$OUT/flex_tests.log" 2>&1 &
  tests=$!
  pids=()
  for lr in ${GRID_LRS:-1e-4 3e-4}; do
    grid="runs/gpu-grid-lr$lr"
    settings=(--task cola --seeds "${SEEDS:-5}" --epochs "${EPOCHS:-3}" --lr "$lr" --batch-size 32 --data-dir "$GLUE" --resume
      ${GRID_EXTRA:-})
    "$PYTHON" -m posprobe finetune "${settings[@]}" --mechanism none --out "$grid/cola-none" > "$OUT/none-$lr.log" 2>&1 &
    pids+=($!)
    "$PYTHON" -m posprobe finetune "${settings[@]}" --mechanism tisa --init fit --out "$grid/cola-tisa" \
      > "$OUT/tisa-$lr.log" 2>&1 &
    pids+=($!)
    "$PYTHON" -m posprobe finetune "${settings[@]}" --mechanism composite --out "$grid/cola-composite" \
      > "$OUT/composite-$lr.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || echo "a grid cell failed (pid $pid)"; done
  for lr in ${GRID_LRS:-1e-4 3e-4}; do
    grid="runs/gpu-grid-lr$lr"
    settings=(--task cola --seeds "${SEEDS:-5}" --epochs "${EPOCHS:-3}" --lr "$lr" --batch-size 32 --data-dir "$GLUE" --resume
      ${GRID_EXTRA:-})
    "$PYTHON" -m posprobe finetune "${settings[@]}" --mechanism none,tisa,composite --init fit --out "$grid" --json \
      > "$OUT/grid-lr$lr.json"
    for f in results.json results.md results.png; do cp "$grid/$f" "$OUT/lr$lr-$f"; done
  done
  wait "$tests" || true
  tail -3 "$OUT/flex_tests.log"
  ;;
*)
  echo "usage: bash benchmarks/gpu_issue36.sh bench|grid" >&2
  exit 2
  ;;
esac
