#!/usr/bin/env bash
# The demo (`make demo`): train the systems of configs/demo.sh on the embedded
# corpus with the same model size and update budget, average its last checkpoints,
# translate the test set, and print a Markdown table (system, parameters, BLEU,
# targeted accuracy per phenomenon of the corpus, training time, and each system
# against the transformer: BLEU difference, p-value of a paired bootstrap test and
# whether it is significantly better or worse), also written to DEMO_DIR/results.md.
#
# Usage: demo.sh            (settings in configs/demo.sh; environment overrides:)
#   DEMO_DIR=runs/demo      where everything goes (git-ignored)
#   DEMO_ONLY="a b"         run these systems (names from configs/demo.sh; default:
#                           its DEMO_DEFAULT; "all": every system it lists)
#   DEMO_SEEDS=N            train each system N times, with seeds 1..N (or a list:
#                           DEMO_SEEDS=1,5,7); the table then shows each column's mean
#                           ± standard deviation over the seeds and the number of seeds,
#                           and the test pools the seeds' translations (default: one
#                           run, with DEMO_SEED of configs/demo.sh, 1)
#   DEMO_MAX_UPDATE=N       updates per system (default in configs/demo.sh)
#   DEMO_JOBS=N             runs trained at the same time (default: 2 on a machine
#                           with 2 or more cores, else 1); the cores are shared out
#   DEMO_CONFIG=FILE        another configuration file
#
# Results (fairseq-localness-results): DEMO_DIR/results.md (the table; with several
# seeds, every seed's numbers below it), results.json (per seed, mean, standard
# deviation, the tests), results.tsv (one line per run), runs.tsv (the runs).
# Each run's commands and logs: DEMO_DIR/systems/<name>/seed<N>/ (demo.log,
# train.log, eval/).
#
# Rerunnable: each run builds everything in DEMO_DIR.partial/ and replaces DEMO_DIR
# only when all systems are done, so an interrupted run leaves the previous results
# as they were (and DEMO_DIR.partial/ to look at).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

case "${1:-}" in
    -h|--help) usage; exit 0 ;;
    "") ;;
    *) die "unexpected argument '$1' (settings come from configs/demo.sh and DEMO_* variables)" ;;
esac

declare -A ENV_AT_START=()  # (the settings given, for the command on the page)
for v in DEMO_CONFIG DEMO_SEEDS DEMO_ONLY DEMO_MAX_UPDATE DEMO_JOBS; do ENV_AT_START[$v]="${!v:-}"; done
DEMO_CONFIG="${DEMO_CONFIG:-$REPO_DIR/configs/demo.sh}"
require_file "$DEMO_CONFIG" DEMO_CONFIG
# shellcheck source=../configs/demo.sh
. "$DEMO_CONFIG"
DEMO_DIR="${DEMO_DIR:-$REPO_DIR/runs/demo}"
DEMO_DIR="${DEMO_DIR%/}"

# ---- validate the configuration (all systems) before doing anything
require_int DEMO_MAX_UPDATE "$DEMO_MAX_UPDATE" 1
require_int DEMO_AVERAGE_LAST "$DEMO_AVERAGE_LAST" 1
NCORES=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
DEMO_JOBS="${DEMO_JOBS:-$(( NCORES >= 2 ? 2 : 1 ))}"
require_int DEMO_JOBS "$DEMO_JOBS" 1
require_int DEMO_SEED "$DEMO_SEED" 0
# DEMO_SEEDS: a count N (seeds 1..N) or a comma-separated list of seeds (lib.sh's
# parse_seeds, as the reproduce drivers' --seeds)
if [[ -z "${DEMO_SEEDS:-}" ]]; then
    SEEDS=("$((10#$DEMO_SEED))")
else
    parse_seeds DEMO_SEEDS "$DEMO_SEEDS"
fi
DEMO_ONLY="${DEMO_ONLY:-${DEMO_DEFAULT:-all}}"
[[ "$DEMO_ONLY" == all ]] && DEMO_ONLY=""
NAMES=() ARCHS=() EXTRAS=()
for entry in "${DEMO_SYSTEMS[@]}"; do
    IFS='|' read -r name arch extra <<< "$entry"
    [[ "$name" =~ ^[A-Za-z0-9_.+-]+$ ]] || die "$DEMO_CONFIG: system name '$name' (in '$entry'): expected letters, digits, _ . + -"
    [[ -n "$arch" ]] || die "$DEMO_CONFIG: system '$name' has no architecture; expected '<name>|<arch>|<extra args>'"
    if [[ -n "${DEMO_ONLY:-}" && " $DEMO_ONLY " != *" $name "* ]]; then
        continue
    fi
    NAMES+=("$name") ARCHS+=("$arch") EXTRAS+=("$extra")
done
if [[ -n "${DEMO_ONLY:-}" ]]; then
    for want in $DEMO_ONLY; do
        [[ " ${NAMES[*]} " == *" $want "* ]] || die "DEMO_ONLY: no system '$want' in $DEMO_CONFIG; expected some of: \
$(for e in "${DEMO_SYSTEMS[@]}"; do printf '%s ' "${e%%|*}"; done)"
    done
fi
(( ${#NAMES[@]} )) || die "no systems to run (DEMO_SYSTEMS in $DEMO_CONFIG is empty)"
for arch in $(printf '%s\n' "${ARCHS[@]}" | sort -u); do
    check_arch "$arch"
done

WORK="$DEMO_DIR.partial"
echo "${PROG}: systems: ${NAMES[*]}; seed(s) ${SEEDS[*]}; ${DEMO_MAX_UPDATE} updates each; building in $WORK" >&2
rm -rf "$WORK"
mkdir -p "$WORK"
T_START=$(date +%s)
# what the page (report.html) shows of the run: the command, the commit, the hardware
DEMO_COMMAND=""
for v in DEMO_CONFIG DEMO_SEEDS DEMO_ONLY DEMO_MAX_UPDATE DEMO_JOBS; do
    [[ -n "${ENV_AT_START[$v]:-}" ]] && DEMO_COMMAND+="$v=$(printf '%q' "${ENV_AT_START[$v]}") "
done
"$PY" "$SCRIPTS_DIR/report.py" "$WORK" --record-run --command "${DEMO_COMMAND}bash scripts/demo.sh" --driver demo \
    --title "The demo: ${NAMES[*]} on the embedded corpus, ${DEMO_MAX_UPDATE} updates, seed(s) ${SEEDS[*]}" \
    --devices "CPU: $DEMO_JOBS run(s) at a time on $NCORES core(s)" \
    || echo "${PROG}: warning: $WORK/run.json could not be written" >&2

# ---- data: corpus -> subwords -> binarized
run fairseq-localness-corpus --out "$WORK/data/raw" --src "$DEMO_SRC" --tgt "$DEMO_TGT" "${DEMO_CORPUS_ARGS[@]}"
run bash "$SCRIPTS_DIR/prepare_bpe.sh" --raw "$WORK/data/raw" --out "$WORK/data/bpe" \
    --src "$DEMO_SRC" --tgt "$DEMO_TGT" "${DEMO_BPE_ARGS[@]}"
run bash "$SCRIPTS_DIR/preprocess.sh" --data "$WORK/data/bpe" --dest "$WORK/data/bin" \
    --src "$DEMO_SRC" --tgt "$DEMO_TGT"

# ---- systems
# One run (a system and a seed): train, average, translate, score; its commands and
# their output go to $dir/demo.log.
run_system() {
    local name="$1" arch="$2" extra_str="$3" seed="$4" dir="$5"
    local -a extra
    read -r -a extra <<< "$extra_str"
    exec >> "$dir/demo.log" 2>&1
    run bash "$SCRIPTS_DIR/train.sh" --arch "$arch" --data-bin "$WORK/data/bin" --save-dir "$dir" \
        --max-update "$DEMO_MAX_UPDATE" --src "$DEMO_SRC" --tgt "$DEMO_TGT" --seed "$seed" \
        -- "${DEMO_MODEL_ARGS[@]}" "${DEMO_TRAIN_ARGS[@]}" "${extra[@]}" > "$dir/train.log" 2>&1 \
        || { tail -20 "$dir/train.log"; return 1; }
    # When the last update ends an epoch, fairseq saves it only as checkpoint_last.pt
    # (no update checkpoint); put it in the series so the average ends with it.
    # (fairseq logs each save once, under the first of the names it saves to)
    local epoch final n_ckpt n_avg
    read -r epoch final < <(sed -n 's/.*Saved checkpoint .* (epoch \([0-9]*\) @ \([0-9]*\) updates.*/\1 \2/p' \
        "$dir/train.log" | tail -1)
    if [[ -n "${final:-}" && ! -f "$dir/checkpoint_${epoch}_${final}.pt" ]]; then
        cp "$dir/checkpoint_last.pt" "$dir/checkpoint_${epoch}_${final}.pt"
    fi
    n_ckpt=$(ls "$dir" | grep -cE '^checkpoint_[0-9]+_[0-9]+\.pt$' || true)
    n_avg=$(( n_ckpt < DEMO_AVERAGE_LAST ? n_ckpt : DEMO_AVERAGE_LAST ))
    (( n_avg >= 1 )) || { echo "$name: training left no update checkpoints in $dir"; return 1; }
    run bash "$SCRIPTS_DIR/average.sh" --save-dir "$dir" --last "$n_avg" --by update \
        --output "$dir/checkpoint_avg.pt"
    run bash "$SCRIPTS_DIR/evaluate.sh" --data-bin "$WORK/data/bin" --checkpoint "$dir/checkpoint_avg.pt" \
        --src "$DEMO_SRC" --tgt "$DEMO_TGT" --ref "$WORK/data/raw/test.$DEMO_TGT" \
        --beam "$DEMO_BEAM" --lenpen "$DEMO_LENPEN" --out "$dir/eval"
    run fairseq-localness-corpus --out "$WORK/data/raw" --src "$DEMO_SRC" --tgt "$DEMO_TGT" \
        --score "$dir/eval/hyp.detok" > "$dir/eval/phenomena.json"
}

# Runs go DEMO_JOBS at a time, each with an equal share of the cores as torch
# threads (tiny models use one core poorly, so two single-threaded runs on two cores
# finish sooner than the same runs one after the other with two threads each).
THREADS=$(( NCORES / DEMO_JOBS > 0 ? NCORES / DEMO_JOBS : 1 ))
echo "${PROG}: ${DEMO_JOBS} run(s) at a time, ${THREADS} torch thread(s) each; logs in $WORK/systems/<name>/seed<N>/" >&2
declare -A PID_OF=()
kill_tree() {    # a running system and every process it started
    local child
    for child in $(pgrep -P "$1" 2>/dev/null); do
        kill_tree "$child"
    done
    kill "$1" 2>/dev/null || true
}
finish_one() {   # wait for any running run; report it; stop everything if it failed
    local pid job status=0 bleu seconds
    wait -n -p pid "${!PID_OF[@]}" || status=$?
    job="${PID_OF[$pid]}"
    unset "PID_OF[$pid]"
    local dir="$WORK/systems/${job% *}/seed${job#* }"
    if (( status != 0 )); then
        echo "${PROG}: ${job% *} (seed ${job#* }) failed (exit status $status); its log, $dir/demo.log, ends:" >&2
        tail -25 "$dir/demo.log" >&2
        for pid in "${!PID_OF[@]}"; do
            kill_tree "$pid"
        done
        exit 1
    fi
    bleu=$("$PY" -c 'import json,sys; print("%.2f" % json.load(open(sys.argv[1]))["score"])' "$dir/eval/bleu.json")
    seconds=$(sed -n 's/.*done training in \([0-9.]*\) seconds.*/\1/p' "$dir/train.log" | tail -1)
    echo "${PROG}: ${job% *} (seed ${job#* }) done: BLEU $bleu, trained in ${seconds:-?} s" >&2
}
# seed by seed, so that a partial run has every system of the first seeds
printf 'system\tseed\tdir\tarch\n' > "$WORK/runs.tsv"
for seed in "${SEEDS[@]}"; do
    for i in "${!NAMES[@]}"; do
        (( ${#PID_OF[@]} < DEMO_JOBS )) || finish_one
        name="${NAMES[$i]}" dir="$WORK/systems/${NAMES[$i]}/seed$seed"
        mkdir -p "$dir"
        # (run directories relative to runs.tsv: valid after $WORK becomes $DEMO_DIR)
        printf '%s\t%s\t%s\t%s\n' "$name" "$seed" "systems/$name/seed$seed" "${ARCHS[$i]}" >> "$WORK/runs.tsv"
        echo "${PROG}: $name (${ARCHS[$i]}, seed $seed) started" >&2
        OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS \
            run_system "$name" "${ARCHS[$i]}" "${EXTRAS[$i]}" "$seed" "$dir" &
        PID_OF[$!]="$name $seed"
    done
done
while (( ${#PID_OF[@]} )); do
    finish_one
done

# ---- table: mean ± sd over the seeds, paired bootstrap against the transformer
# (the first system when the transformer is not run)
BASELINE="${NAMES[0]}"
[[ " ${NAMES[*]} " == *" transformer "* ]] && BASELINE=transformer
run fairseq-localness-results --layout demo --runs "$WORK/runs.tsv" --ref "$WORK/data/raw/test.$DEMO_TGT" \
    --baseline "$BASELINE" --out "$WORK" \
    --note "Test set of the embedded corpus ($(wc -l < "$WORK/data/raw/test.$DEMO_TGT") sentences). Phenomenon \
columns: targeted accuracy (%) of the words each phenomenon decides (fairseq_localness.corpus.score_checks). \
$DEMO_MAX_UPDATE updates per system, average of the last checkpoints; train time as reported by fairseq-train." \
    > /dev/null

rm -rf "$DEMO_DIR.old"
if [[ -e "$DEMO_DIR" ]]; then
    mv "$DEMO_DIR" "$DEMO_DIR.old"
fi
mv "$WORK" "$DEMO_DIR"
rm -rf "$DEMO_DIR.old"
"$PY" "$SCRIPTS_DIR/report.py" "$DEMO_DIR" || echo "${PROG}: warning: $DEMO_DIR/report.html could not be written" >&2
echo
echo "Demo finished in $(( $(date +%s) - T_START )) s. Results ($DEMO_DIR/results.md):"
echo
cat "$DEMO_DIR/results.md"
