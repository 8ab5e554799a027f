#!/usr/bin/env bash
# Run the papers' analyses (fairseq-localness-analysis, docs/analysis.md) on a
# finished demo: every tool whose systems the demo trained, on the embedded corpus.
#
# Usage: analyze_demo.sh [--demo-dir DIR] [--out DIR] [--src L --tgt L] [--force]
#
# Tools and the demo systems they read (a tool whose systems are missing is skipped,
# with a message). A demo with several seeds (DEMO_SEEDS): efficiency and
# learning_curves read every seed's log (mean and spread over the seeds); the other
# tools read each system's first seed.
#   bleu_breakdown    every system against `transformer` (DC Fig. 5, Yang Fig. 4)
#   efficiency        every system's training logs (the papers' Param./Speed columns)
#   learning_curves   every system's validation loss (Song Fig. 4)
#   gates             hybrid-gate, per layer and per POS tag (Xu Fig. 3, Fig. 4)
#   windows           localness, localness-relpos (Yang Fig. 3, Fig. 2)
#   heatmaps          hysan and hysan-nopos, first test sentence (Song Fig. 5)
#   divergence        enc-dc, full-dc (DC Fig. 4)
#   probing           transformer, localness, hybrid-gate, hysan, enc-dc on the
#                     corpus's SentEval-format probing tasks (Xu Tables 3-4, DC Table 4)
#
# The output is built in OUT.partial/ and renamed at the end; with the default OUT, the
# demo's page (DEMO_DIR/report.html, fairseq-localness-report) is written again with
# the figures.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parse_options "$@" <<'EOF'
--demo-dir DIR  DEMO_DIR  text  -
    a finished `make demo` run (default: runs/demo), with runs.tsv
    and systems/<name>/seed<N>/{train.log,checkpoint_avg.pt,eval/hyp.detok}
--out DIR       OUT       text  -
    where the tools write (default: DEMO_DIR/analysis); one folder
    per tool, each with its CSV/JSON and PNG
--src L         SRC       lang  src
--tgt L         TGT       lang  tgt
    the demo's language codes (default: src, tgt as in configs/demo.sh)
--force         FORCE     flag  -
    replace an existing --out directory
EOF
DEMO_DIR="${DEMO_DIR:-$REPO_DIR/runs/demo}"
DEMO_DIR="${DEMO_DIR%/}"
OUT="${OUT:-$DEMO_DIR/analysis}"
OUT="${OUT%/}"

# ---- validate
require_dir "$DEMO_DIR" --demo-dir
if [[ ! -f "$DEMO_DIR/runs.tsv" && -f "$DEMO_DIR/results.tsv" ]]; then
    die "--demo-dir: '$DEMO_DIR' is a demo of an earlier layout (systems/<name>/, no runs.tsv); run 'make demo' again"
fi
require_file "$DEMO_DIR/runs.tsv" "--demo-dir (a finished demo has runs.tsv)"
require_dir "$DEMO_DIR/data/bin" "--demo-dir"
[[ ! -e "$OUT" || $FORCE == 1 ]] || die "--out: '$OUT' exists; use --force to replace it"
require_file "$DEMO_DIR/data/raw/test.$TGT" "--demo-dir (reference)"
# runs.tsv: system, seed, run directory (relative to DEMO_DIR), ...; one line per run
SYSTEMS=() RUN_DIRS=()    # every run, as "name<TAB>dir"
declare -A FIRST=()       # each system's first run directory
while IFS=$'\t' read -r name seed dir _; do
    [[ "$name" == system ]] && continue
    [[ "$dir" == /* ]] || dir="$DEMO_DIR/$dir"
    RUN_DIRS+=("$name"$'\t'"$dir")
    if [[ -z "${FIRST[$name]:-}" ]]; then
        SYSTEMS+=("$name")
        FIRST[$name]="$dir"
    fi
done < "$DEMO_DIR/runs.tsv"
(( ${#SYSTEMS[@]} )) || die "--demo-dir: $DEMO_DIR/runs.tsv lists no runs"
CKPT() { echo "${FIRST[$1]:-$DEMO_DIR/systems/$1}/checkpoint_avg.pt"; }
have() { [[ -f "$(CKPT "$1")" ]]; }
skip() { echo "${PROG}: skipping $1: the demo has no $2" >&2; }

WORK="$OUT.partial"
rm -rf "$WORK"
mkdir -p "$WORK"
A=(fairseq-localness-analysis)
DATA="$DEMO_DIR/data/bin"
# pick NAME...: paths=(--path CKPT ...) and labels=(NAME ...) of the systems the demo has
pick() {
    paths=() labels=()
    local s
    for s in "$@"; do
        if have "$s"; then
            paths+=(--path "$(CKPT "$s")")
            labels+=("$s")
        fi
    done
}

# ---- from the hypotheses and logs: every system (logs: every seed)
hyps=() eff=() curves=()
for s in "${SYSTEMS[@]}"; do
    hyps+=(--hyp "$s=${FIRST[$s]}/eval/hyp.detok")
done
for entry in "${RUN_DIRS[@]}"; do
    eff+=(--system "${entry%%$'\t'*}=${entry#*$'\t'}/train.log")
    curves+=(--log "${entry%%$'\t'*}=${entry#*$'\t'}/train.log")
done
baseline=()
[[ " ${SYSTEMS[*]} " == *" transformer "* ]] && baseline=(--baseline transformer)
run "${A[@]}" bleu_breakdown --ref "$DEMO_DIR/data/raw/test.$TGT" --src "$DEMO_DIR/data/bpe/test.$SRC" \
    "${hyps[@]}" "${baseline[@]}" --buckets 6,8,10,12 --output-dir "$WORK/bleu_breakdown" --no-progress
run "${A[@]}" efficiency "${eff[@]}" "${baseline[@]}" \
    --output-dir "$WORK/efficiency" --no-progress
run "${A[@]}" learning_curves "${curves[@]}" --train-loss \
    --output-dir "$WORK/learning_curves" --no-progress

# ---- from the checkpoints
if have hybrid-gate; then
    run "${A[@]}" pos_tags --input "$DEMO_DIR/data/raw/valid.$SRC" --output "$WORK/valid.pos" \
        --words-output "$WORK/valid.words"
    run "${A[@]}" gates "$DATA" --path "$(CKPT hybrid-gate)" --pos-tags "$WORK/valid.pos" \
        --pos-words "$WORK/valid.words" --output-dir "$WORK/gates" --no-progress
else
    skip gates "hybrid-gate system"
fi

pick localness localness-relpos
if (( ${#labels[@]} )); then
    run "${A[@]}" windows "$DATA" "${paths[@]}" --labels "${labels[@]}" --output-dir "$WORK/windows" --no-progress
else
    skip windows "localness system"
fi

pick hysan hysan-nopos
if (( ${#labels[@]} )); then
    run "${A[@]}" heatmaps "$DATA" "${paths[@]}" --labels "${labels[@]}" --split test --ids 0 --layer 1 \
        --output-dir "$WORK/heatmaps"
else
    skip heatmaps "hysan system"
fi

pick enc-dc full-dc
if (( ${#labels[@]} )); then
    run "${A[@]}" divergence "$DATA" "${paths[@]}" --labels "${labels[@]}" --output-dir "$WORK/divergence" --no-progress
else
    skip divergence "enc-dc or full-dc system"
fi

pick transformer localness hybrid-gate hysan enc-dc
if (( ${#labels[@]} )); then
    run "${A[@]}" corpus_probes --corpus-dir "$DEMO_DIR/data/raw" --src "$SRC" --tgt "$TGT" \
        --output-dir "$WORK/probing_tasks"
    run "${A[@]}" probing "$DATA" "${paths[@]}" --labels "${labels[@]}" --senteval-dir "$WORK/probing_tasks" \
        --bpe sentencepiece --sentencepiece-model "$DATA/sentencepiece.bpe.model" \
        --output-dir "$WORK/probing" --no-progress
else
    skip probing "system with an encoder to probe"
fi

rm -rf "$OUT"
mv "$WORK" "$OUT"
echo "${PROG}: wrote $OUT:" >&2
(cd "$OUT" && find . -name '*.png' | sort) >&2
# the demo's page (report.html) with these figures, where they are in DEMO_DIR/analysis
if [[ "$OUT" -ef "$DEMO_DIR/analysis" ]]; then
    "$PY" "$SCRIPTS_DIR/report.py" "$DEMO_DIR" || echo "${PROG}: warning: $DEMO_DIR/report.html could not be written" >&2
fi
