#!/usr/bin/env bash
# The GPU check: everything this project measures and tests on a CUDA GPU, in one go.
#
# Usage: gpu_check.sh --data-bin DIR --out DIR [--budget SECONDS] [--stages LIST]
#                     [--systems LIST] [--bench-systems all]
#
# 1. the benchmark (docs/benchmark.md) of the transformer and each model's main system
#    (--bench-systems all: every system of --list) at WMT's batch shapes, Transformer-base
#    size: 32 x 128 and 8 x 512 tokens per training step (one sweep, --lengths 128,512
#    --tokens-per-batch 4096), in fp16 and then in bf16, with --profile, all systems in
#    one group (timed in the same rounds as the transformer);
# 2. the attention core's tests on CUDA (tests/test_attention_core.py, its "cuda" cases);
# 3. 200 updates of fairseq-train per model in --fp16 and in --bf16 (all runs at once; the
#    GPU has room for them), each summarised in train.tsv by scripts/train_log_summary.py:
#    updates reached, the last training loss, NaN/inf losses and fp16 loss-scale
#    reductions ("gradient overflow").
#
# Each stage has a share of --budget (default 420 s) and stops at it, keeping what it
# wrote: a benchmark sweep writes bench.json/bench.md after each length. Results go to
# OUT (bench-fp16/, bench-bf16/, tests.txt, train.tsv, train/<run>.log, device.txt);
# OUT/gpu_check.tar.gz holds all of them, and OUT/bench-<dtype>.tar.gz each benchmark as
# soon as it ends. On an H200 (2026-11), 175 s per dtype (--budget 585) covered T=128 of
# the 8 main systems but not T=512: give the benchmark more (--budget 900 or more) for
# both lengths. The CUDA tests took 29 s; the 16 training runs, side by side, ended
# within the 170 s that --budget 470 left them.
#
# DIR is a fairseq-preprocess'd folder with a joined dictionary (the demo's:
# scripts/demo.sh, or fairseq-localness-corpus + prepare_bpe.sh + preprocess.sh). On a
# machine without fairseq installed, install it first (docs/installation.md, "A GPU
# machine without internet"); the package is then imported from this checkout.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parse_options "$@" <<'EOF'
--data-bin DIR          DATA_BIN       dir          required
    a fairseq-preprocess'd folder with a joined dictionary (src, tgt)
--out DIR               OUT_DIR        text         required
    where the results go (created)
--budget SECONDS        BUDGET         int:60       420
    the time of all stages together: 0.3 of it for each benchmark, the rest
    for the tests and the training runs
--stages LIST           STAGES         text         -
    which of bench, tests and train to run, e.g. "bench tests" (default: all three)
--systems LIST          SYSTEMS        text         -
    the training runs' systems (default: transformer localness
    localness-relpos hybrid hysan enc-dc dec-dc full-dc)
--bench-systems all     BENCH_ALL      choice:all   -
    benchmark every system of fairseq-localness-bench --list instead of the
    transformer and each model's main system
EOF
STAGES="${STAGES:-bench tests train}"
SYSTEMS="${SYSTEMS:-transformer localness localness-relpos hybrid hysan enc-dc dec-dc full-dc}"
BENCH_SYSTEMS=("transformer" "localness (query, enc 1-3)" "localness + rel_pos" "hybrid (gate, enc 1-2)"
               "hysan e1 (gated)" "enc-dc (f=2)" "dec-dc (f=2)" "full-dc (f=2)")
[[ -z "$BENCH_ALL" ]] || BENCH_SYSTEMS=()
require_file "$DATA_BIN/dict.src.txt" --data-bin

# fairseq's arguments per system of the training stage (Transformer-base for IWSLT)
declare -A ARCH=(
    [transformer]="transformer_iwslt_de_en"
    [localness]="localness_transformer_iwslt_de_en"
    [localness-relpos]="localness_transformer_iwslt_de_en --localness-rel-pos"
    [hybrid]="hybrid_transformer_iwslt_de_en"
    [hysan]="hysan_transformer_iwslt_de_en"
    [enc-dc]="dc_transformer_iwslt_de_en --dc-mode enc"
    [dec-dc]="dc_transformer_iwslt_de_en --dc-mode dec"
    [full-dc]="dc_transformer_iwslt_de_en --dc-mode full"
)
for s in $STAGES; do
    [[ "$s" =~ ^(bench|tests|train)$ ]] || die "--stages: unknown stage '$s' (allowed: bench tests train)"
done
stage() { [[ " $STAGES " == *" $1 "* ]]; }
for s in $SYSTEMS; do
    [[ -n "${ARCH[$s]:-}" ]] || die "--systems: unknown system '$s' (allowed: ${!ARCH[*]})"
done

"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
    || die "no CUDA GPU: this check measures and tests on a GPU (the CPU's benchmark is 'make bench')"
mkdir -p "$OUT_DIR/train"
OUT_DIR="$(cd "$OUT_DIR" && pwd -P)"
export PYTHONPATH="${REPO_DIR}${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
START=$SECONDS
left() { echo $(( BUDGET - (SECONDS - START) )); }

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    "$PY" -c "import torch, fairseq; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| fairseq', fairseq.__version__)"
} > "$OUT_DIR/device.txt" 2>&1
cat "$OUT_DIR/device.txt" >&2

# 1. the benchmark: 32 x 128 and 8 x 512 tokens, fp16 then bf16 (0.3 of the budget each)
stage bench && for dtype in fp16 bf16; do
    t=$(( BUDGET * 3 / 10 ))
    echo "${PROG}: benchmark, $dtype (at most ${t} s)" >&2
    run timeout "$t" "$PY" -m fairseq_localness.cli.benchmark --dtype "$dtype" --size wmt_en_de \
        ${BENCH_SYSTEMS[@]+--systems "${BENCH_SYSTEMS[@]}"} --group-size 8 \
        --lengths 128,512 --tokens-per-batch 4096 --decode-tokens 1024 --max-decode-len 32 \
        --repeats 3 --profile --output-dir "$OUT_DIR/bench-$dtype" \
        > "$OUT_DIR/bench-$dtype.log" 2>&1 \
        || echo "${PROG}: the $dtype benchmark stopped (exit status $?): see bench-$dtype.log" >&2
    tar -C "$OUT_DIR" -czf "$OUT_DIR/bench-$dtype.tar.gz" "bench-$dtype" "bench-$dtype.log" 2>/dev/null || true
done

# 2 and 3 side by side: the CUDA tests and the training runs (what is left of the budget)
t=$(( $(left) > 30 ? $(left) - 10 : 30 ))
echo "${PROG}: CUDA tests and training runs (at most ${t} s)" >&2
tests_pid=""
if stage tests; then
    timeout "$t" "$PY" -m pytest -q -p no:cacheprovider -p no:xdist -k cuda tests/test_attention_core.py \
        > "$OUT_DIR/tests.txt" 2>&1 &
    tests_pid=$!
fi
pids=()
stage train && for s in $SYSTEMS; do
    for dtype in fp16 bf16; do
        # shellcheck disable=SC2086  # ARCH holds the arch and its options
        timeout "$t" "$PY" -m fairseq_cli.train "$DATA_BIN" --user-dir "$REPO_DIR/fairseq_localness" \
            --task translation -s src -t tgt --arch ${ARCH[$s]} --share-all-embeddings \
            --optimizer adam --adam-betas '(0.9, 0.98)' --lr 5e-4 --lr-scheduler inverse_sqrt \
            --warmup-updates 100 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
            --max-tokens 4096 --max-update 200 --"$dtype" --seed 1 --num-workers 0 \
            --no-save --disable-validation --log-format simple --log-interval 20 --no-progress-bar \
            > "$OUT_DIR/train/$s.$dtype.log" 2>&1 &
        pids+=($!)
    done
done
for p in "${pids[@]}"; do wait "$p" || true; done
[[ -z "$tests_pid" ]] || wait "$tests_pid" || echo "${PROG}: the CUDA tests failed or stopped: see tests.txt" >&2

stage train && "$PY" "$SCRIPTS_DIR/train_log_summary.py" "$OUT_DIR/train" > "$OUT_DIR/train.tsv"
! stage train || cat "$OUT_DIR/train.tsv" >&2
! stage tests || tail -1 "$OUT_DIR/tests.txt" >&2
tar -C "$OUT_DIR" --exclude '*.tar.gz' -czf "$OUT_DIR/gpu_check.tar.gz" .
echo "${PROG}: results in $OUT_DIR (all of them: gpu_check.tar.gz), $(( SECONDS - START )) s" >&2
