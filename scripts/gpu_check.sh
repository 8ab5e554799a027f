#!/usr/bin/env bash
# The GPU check: everything this project measures and tests on a CUDA GPU.
#
# Usage: gpu_check.sh --data-bin DIR --out DIR [--budget SECONDS] [--stages LIST]
#                     [--systems LIST] [--bench-systems all] [--dtypes LIST]
#                     [--updates N] [--run-limit SECONDS] [--bench-limit SECONDS]
#                     [--bench-impls LIST] [--bench-lengths LIST] [--probe-limit SECONDS]
#                     [--train-impls LIST]
#
# Stages (--stages; the default, train, fits one 10-minute call with its default budget):
# train  --updates (default 200) updates of fairseq-train (4,096 tokens per batch,
#        IWSLT's Transformer-base) per system in --bf16 (--dtypes: one precision per call
#        by default; "bf16 fp16" needs about twice the time). First every run starts at
#        once for a few updates (the warm-up: the fused kernels' compiling is CPU work,
#        done in parallel, and its results stay in torch's and Triton's caches on disk);
#        then one run at a time so that each has the GPU to itself, the transformer
#        first, each through scripts/gpu_train_probe.py (fairseq-train's own entry point,
#        counting the CUDA kernels of updates 101-103 with torch.profiler and the peak GPU
#        memory), each at most --run-limit seconds, while the budget lasts. Summaries:
#        train.tsv (scripts/train_log_summary.py: updates, last loss, NaN/inf losses, fp16
#        loss-scale reductions) and train.md (scripts/gpu_train_table.py: fairseq's wps
#        after update 125, kernels per step and peak memory, as ratios to the
#        transformer's, for docs/benchmark.md). With --train-impls (e.g. "auto dense")
#        every system but the transformer trains once per value of the models'
#        --attention-impl, run <system>.<value>.<dtype> where the value is not auto.
# bench  the benchmark (docs/benchmark.md) of the transformer and each model's main
#        system (--bench-systems all: every system of --list) at WMT's batch shapes,
#        Transformer-base size: 32 x 128 and 8 x 512 tokens per training step, in each
#        of --dtypes, with --profile (kernels per pass), all systems in one group; each
#        dtype at most --bench-limit seconds (the rounds done are kept). First a warm-up
#        (at most a third of that and 150 s, and only where it leaves the benchmark 30 s):
#        the systems whose calls compile on CUDA (localness,
#        localness + rel_pos, hybrid, HySAN) run one benchmark round each, all at once,
#        so that their compiling (minutes, one system after the other, in the benchmark
#        itself) is done in parallel into torch's and Triton's caches on disk, which the
#        benchmark then reads.
# probe  scripts/gpu_attention_probe.py: first the beam search of the transformer,
#        rel_pos, HySAN and Dec-DC with their steps' attention as one fused call each
#        and with the step kernels; then one attention sublayer of each system (the
#        transformer and each model's main system), forward and backward, its host and
#        device time per path (the fused calls with dynamic shapes, attention_impl
#        "dense" with one SDPA call per branch and no compiled call, the fused calls with
#        Inductor's C++ wrapper, with HySAN's gate after its fused call instead of within
#        it, with static shapes, the eager path), in
#        the first of --dtypes, within --probe-limit seconds: probe.md.
# tests  the CUDA tests of the attention core, of the fused kernels and steps, of the
#        stacked projections and of --bf16's flat master (tests/test_attention_core.py,
#        tests/test_flex_path.py, tests/test_fused_steps.py, tests/test_dense_path.py,
#        tests/test_host_syncs.py (no system waits for the GPU more often than the transformer),
#        tests/test_dc_transformer.py, tests/test_projections.py,
#        tests/test_mixed_precision.py, tests/test_benchmark.py: "cuda" cases), on 8
#        pytest-xdist workers where pytest-xdist is installed (each test compiles its own
#        kinds of fused call: about 3 s a test on one worker, on an H200).
#
# What an H200 showed (torch 2.11, bf16; docs/benchmark.md, "On a GPU"): a fairseq-train
# process takes about 11 s to start and its first epoch's 19 updates 8 s (20 s in the
# machine's first process); the transformer then runs about 10 updates a second; a
# system with fused calls had logged no update 38 s after its start, compiling.
#
# Results go to OUT (train.md, train.tsv, train/<system>[.<attention impl>].<dtype>.log, warm/ (the warm-ups' logs),
# bench-<dtype>/, probe.md and probe.log, tests.txt, device.txt and device.err); OUT/gpu_check.tar.gz holds all of them.
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
--budget SECONDS        BUDGET         int:60       540
    the time of all stages together (the benchmark first, then the tests,
    then the training runs with what is left)
--bench-limit SECONDS   BENCH_LIMIT    int:30       520
    the time limit of the benchmark of one dtype
--bench-impls LIST      BENCH_IMPLS    text         -
    the benchmark's --attention-impl values (default: auto), e.g. "auto dense":
    every system once per value, timed in the same rounds
--bench-lengths LIST    BENCH_LENGTHS  text         128,512
    the benchmark's sentence lengths (4,096 tokens per training step at each)
--stages LIST           STAGES         text         -
    which of train, bench, probe and tests to run, e.g. "bench tests"
    (default: train); they run in that order: bench, probe, tests, train
--train-impls LIST      TRAIN_IMPLS    text         -
    the models' --attention-impl values of the training runs (default: auto),
    e.g. "auto dense": every system but the transformer once per value (so
    about twice the runs: narrow --systems or raise --budget)
--probe-limit SECONDS   PROBE_LIMIT    int:30       240
    the time limit of the probe stage
--probe-variants LIST   PROBE_VARIANTS text         -
    the probe's attention paths, comma-separated (default: the probe's own,
    auto,dense,cpp,apart,static,eager), e.g. auto,dense for the fewest rows
--systems LIST          SYSTEMS        text         -
    the training runs' systems (default: transformer localness
    localness-relpos hybrid hysan enc-dc dec-dc full-dc)
--bench-systems all     BENCH_ALL      choice:all   -
    benchmark every system of fairseq-localness-bench --list instead of the
    transformer and each model's main system
--dtypes LIST           DTYPES         text         -
    the precisions of the benchmark and the training runs, in order
    (default: bf16); "bf16 fp16" runs everything in both and needs about
    twice the budget
--updates N             UPDATES        int:150      200
    updates of each training run (its speed is fairseq's wps after update
    125, the profiled updates 101-103 left out)
--run-limit SECONDS     RUN_LIMIT      int:30       90
    the time limit of one timed training run (a run cut short keeps the
    intervals it logged)
EOF
# each_of OPTION WHAT LIST ALLOWED...: every word of LIST is one of ALLOWED, each once
each_of() {
    local opt="$1" what="$2" list="$3" word seen=" "
    shift 3
    for word in $list; do
        [[ " $* " == *" $word "* ]] || die "$opt: unknown $what '$word' (allowed: $*)"
        [[ "$seen" != *" $word "* ]] || die "$opt: $what '$word' given twice"
        seen+="$word "
    done
}
STAGES="${STAGES:-train}"
BENCH_IMPLS="${BENCH_IMPLS:-auto}"
each_of --bench-impls value "$BENCH_IMPLS" auto sdpa eager flex dense
TRAIN_IMPLS="${TRAIN_IMPLS:-auto}"
each_of --train-impls value "$TRAIN_IMPLS" auto sdpa eager flex dense
[[ "$BENCH_LENGTHS" =~ ^[0-9]+(,[0-9]+)*$ ]] \
    || die "--bench-lengths: expected comma-separated whole numbers (e.g. 128,512), got '$BENCH_LENGTHS'"
each_of --probe-variants variant "${PROBE_VARIANTS//,/ }" auto static eager dense apart cpp graphs blocks
DTYPES="${DTYPES:-bf16}"
each_of --dtypes precision "$DTYPES" bf16 fp16
SYSTEMS="${SYSTEMS:-transformer localness localness-relpos hybrid hysan enc-dc dec-dc full-dc}"
BENCH_SYSTEMS=("transformer" "localness (query, enc 1-3)" "localness + rel_pos" "hybrid (gate, enc 1-2)"
               "hysan e1 (gated)" "enc-dc (f=2)" "dec-dc (f=2)" "full-dc (f=2)")
[[ -z "$BENCH_ALL" ]] || BENCH_SYSTEMS=()
# every row of the benchmark in one group (its systems but the transformer, once per value
# of --bench-impls), so that every round times them all
BENCH_ROWS=$(( ${#BENCH_SYSTEMS[@]} - 1 ))
[[ -z "$BENCH_ALL" ]] || BENCH_ROWS=$(( $("$PY" -m fairseq_localness.cli.benchmark --list 2>/dev/null | wc -l) - 1 ))
(( BENCH_ROWS > 0 )) || die "--bench-systems all: fairseq-localness-bench --list listed no system"
BENCH_GROUP=$(( BENCH_ROWS * $(wc -w <<< "$BENCH_IMPLS") ))
# the benchmark's systems whose attention compiles on CUDA (FlexAttention), warmed up first
BENCH_WARM=("localness (query, enc 1-3)" "localness + rel_pos" "hybrid (gate, enc 1-2)" "hysan e1 (gated)")
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
each_of --stages stage "$STAGES" train bench probe tests
stage() { [[ " $STAGES " == *" $1 "* ]]; }
each_of --systems system "$SYSTEMS" "${!ARCH[@]}"

"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
    || die "no CUDA GPU: this check measures and tests on a GPU (the CPU's benchmark is 'make bench')"
mkdir -p "$OUT_DIR/train" "$OUT_DIR/warm"
OUT_DIR="$(cd "$OUT_DIR" && pwd -P)"
export PYTHONPATH="${REPO_DIR}${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
START=$SECONDS
left() { echo $(( BUDGET - (SECONDS - START) )); }
capped() { local t=$(( $(left) - 10 )); echo $(( t < $1 ? t : $1 )); }  # what is left (10 s kept), at most $1

{   # (fairseq's import warnings go to device.err)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || true
    "$PY" - 2>"$OUT_DIR/device.err" <<'PYTHON' || echo "(torch or fairseq did not import: see device.err)"
import importlib.metadata as metadata

import fairseq
import torch

try:
    triton = metadata.version("triton")
except metadata.PackageNotFoundError:
    triton = None
print("torch", torch.__version__, "cuda", torch.version.cuda, "| fairseq", fairseq.__version__, "| triton", triton)
PYTHON
} > "$OUT_DIR/device.txt"
cat "$OUT_DIR/device.txt" >&2

# the benchmark: 32 x 128 and 8 x 512 tokens, in each dtype
bench() {  # bench TIMEOUT DTYPE REPEATS OUTPUT-DIR PROFILE(yes/no) [SYSTEM...] (none: the benchmark's all)
    local limit="$1" dtype="$2" repeats="$3" dir="$4" profile=()
    [[ "$5" == yes ]] && profile=(--profile)
    shift 5
    # shellcheck disable=SC2086  # BENCH_IMPLS: one argument per value
    run timeout "$limit" "$PY" -m fairseq_localness.cli.benchmark --dtype "$dtype" --size wmt_en_de \
        ${1+--systems "$@"} --group-size "$BENCH_GROUP" --attention-impl $BENCH_IMPLS \
        --lengths "$BENCH_LENGTHS" --tokens-per-batch 4096 --decode-tokens 1024 --max-decode-len 32 \
        --repeats "$repeats" ${profile[@]+"${profile[@]}"} --output-dir "$dir"
}
stage bench && for dtype in $DTYPES; do
    t=$(capped "$BENCH_LIMIT")
    (( t >= 30 )) || { echo "${PROG}: no time left for the $dtype benchmark" >&2; continue; }
    w=$(( t / 3 < 150 ? t / 3 : 150 )) started=$SECONDS
    (( w <= t - 30 )) || w=$(( t - 30 ))  # the benchmark keeps at least 30 s
    if (( w >= 10 )); then
        echo "${PROG}: benchmark warm-up, $dtype: ${#BENCH_WARM[@]} systems at once, one round each (at most ${w} s)" >&2
        pids=()
        for s in "${BENCH_WARM[@]}"; do
            log="$OUT_DIR/warm/bench-$dtype-${#pids[@]}"
            # (2 Inductor compile workers each, as the training stage's warm-up)
            TORCHINDUCTOR_COMPILE_THREADS=2 bench "$w" "$dtype" 1 "$log" no "$s" > "$log.log" 2>&1 & pids+=($!)
        done
        for i in "${!pids[@]}"; do  # (a warm-up cut short still leaves what it compiled)
            wait "${pids[$i]}" || echo "${PROG}: warm-up of ${BENCH_WARM[$i]} stopped (exit status $?):" \
                "see warm/bench-$dtype-$i.log" >&2
        done
    else
        echo "${PROG}: no time for the $dtype benchmark's warm-up" >&2
    fi
    t=$(( t - (SECONDS - started) ))
    (( t >= 30 )) || { echo "${PROG}: no time left for the $dtype benchmark" >&2; continue; }
    echo "${PROG}: benchmark, $dtype (at most ${t} s)" >&2
    bench "$t" "$dtype" 4 "$OUT_DIR/bench-$dtype" yes ${BENCH_SYSTEMS[@]+"${BENCH_SYSTEMS[@]}"} \
        > "$OUT_DIR/bench-$dtype.log" 2>&1 \
        || echo "${PROG}: the $dtype benchmark stopped (exit status $?): see bench-$dtype.log" >&2
    tar -C "$OUT_DIR" -czf "$OUT_DIR/bench-$dtype.tar.gz" "bench-$dtype" "bench-$dtype.log" 2>/dev/null || true
done

# the attention sublayers, per path (probe.md)
if stage probe; then
    t=$(capped "$PROBE_LIMIT")
    if (( t >= 30 )); then
        echo "${PROG}: attention probe, ${DTYPES%% *} (at most ${t} s)" >&2
        timeout "$t" "$PY" "$SCRIPTS_DIR/gpu_attention_probe.py" --dtype "${DTYPES%% *}" --out "$OUT_DIR/probe.md" \
            ${PROBE_VARIANTS:+--variants "$PROBE_VARIANTS"} \
            > "$OUT_DIR/probe.log" 2>&1 || echo "${PROG}: the probe stopped (exit status $?): see probe.log" >&2
    else
        echo "${PROG}: no time left for the probe" >&2
    fi
fi

# the CUDA tests (beside nothing: the training runs time themselves)
if stage tests; then
    t=$(( $(left) > 30 ? $(left) - 10 : 30 ))
    stage train && t=$(( t / 4 ))
    echo "${PROG}: CUDA tests (at most ${t} s)" >&2
    workers=(-p no:xdist)
    "$PY" -c "import xdist" 2>/dev/null && workers=(-n 8)
    timeout "$t" "$PY" -m pytest -v -p no:cacheprovider "${workers[@]}" -k cuda tests/test_attention_core.py \
        tests/test_flex_path.py tests/test_fused_steps.py tests/test_dense_path.py tests/test_host_syncs.py \
        tests/test_dc_transformer.py \
        tests/test_projections.py tests/test_mixed_precision.py tests/test_benchmark.py \
        > "$OUT_DIR/tests.txt" 2>&1 \
        || echo "${PROG}: the CUDA tests failed or stopped: see tests.txt" >&2
    tail -1 "$OUT_DIR/tests.txt" >&2
fi

# the training runs: the warm-up (every run at once, a few updates), then one run at a
# time, the transformer first, each at most RUN_LIMIT seconds while the budget lasts
# (a run cut short keeps the intervals it logged)
train() {  # train LOG TIMEOUT UPDATES RUN (<system>.<dtype> or <system>.<attention impl>.<dtype>)
    local log="$1" limit="$2" updates="$3" run="$4" s dtype impl=()
    s="${run%%.*}" dtype="${run##*.}"
    [[ "$run" == *.*.* ]] && impl=(--attention-impl "$(cut -d. -f2 <<< "$run")")
    # shellcheck disable=SC2086  # ARCH holds the arch and its options
    timeout "$limit" "$PY" "$SCRIPTS_DIR/gpu_train_probe.py" "$DATA_BIN" \
        --user-dir "$REPO_DIR/fairseq_localness" \
        --task translation -s src -t tgt --arch ${ARCH[$s]} ${impl[@]+"${impl[@]}"} --share-all-embeddings \
        --optimizer adam --adam-betas '(0.9, 0.98)' --lr 5e-4 --lr-scheduler inverse_sqrt \
        --warmup-updates 100 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
        --max-tokens 4096 --max-update "$updates" --"$dtype" --seed 1 --num-workers 0 \
        --no-save --disable-validation --log-format simple --log-interval 25 --no-progress-bar \
        > "$log" 2>&1
}
if stage train; then
    runs=()
    for dtype in $DTYPES; do
        runs+=("transformer.$dtype")
        for s in $SYSTEMS; do
            [[ "$s" == transformer ]] && continue
            for impl in $TRAIN_IMPLS; do
                if [[ "$impl" == auto ]]; then runs+=("$s.$dtype"); else runs+=("$s.$impl.$dtype"); fi
            done
        done
    done
    t=$(( $(left) / 4 < 150 ? $(left) / 4 : 150 ))
    if (( t >= 10 )); then
        echo "${PROG}: warm-up: ${#runs[@]} runs at once, 30 updates each (at most ${t} s)" >&2
        pids=()
        for run in "${runs[@]}"; do
            # (2 Inductor compile workers each, so that the runs share the cores instead of
            # each starting a pool as large as the machine)
            GPU_CHECK_PROFILE_FROM=0 TORCHINDUCTOR_COMPILE_THREADS=2 \
                train "$OUT_DIR/warm/$run.log" "$t" 30 "$run" & pids+=($!)
        done
        for pid in "${pids[@]}"; do wait "$pid" || true; done
    else
        echo "${PROG}: no time left for the warm-up" >&2
    fi
    for run in "${runs[@]}"; do
        t=$(capped "$RUN_LIMIT")
        (( t >= 30 )) || { echo "${PROG}: no time left for $run" >&2; continue; }
        echo "${PROG}: training $run (at most ${t} s)" >&2
        train "$OUT_DIR/train/$run.log" "$t" "$UPDATES" "$run" || echo "${PROG}: $run stopped (exit status $?)" >&2
    done
    "$PY" "$SCRIPTS_DIR/train_log_summary.py" "$OUT_DIR/train" > "$OUT_DIR/train.tsv"
    "$PY" "$SCRIPTS_DIR/gpu_train_table.py" "$OUT_DIR/train" "$OUT_DIR/device.txt" > "$OUT_DIR/train.md"
    cat "$OUT_DIR/train.tsv" "$OUT_DIR/train.md" >&2
fi
archive="$(mktemp "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
if tar -C "$OUT_DIR" --exclude '*.tar.gz' -czf "$archive" . && mv "$archive" "$OUT_DIR/gpu_check.tar.gz"; then
    echo "${PROG}: results in $OUT_DIR (all of them: gpu_check.tar.gz), $(( SECONDS - START )) s" >&2
else
    rm -f "$archive"
    echo "${PROG}: results in $OUT_DIR ($(( SECONDS - START )) s); writing gpu_check.tar.gz failed" >&2
fi
