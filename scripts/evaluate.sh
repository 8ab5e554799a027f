#!/usr/bin/env bash
# Translate a binarized test set and score it with sacrebleu (signature printed):
# fairseq-generate -> hypotheses in input order -> subword marks removed ->
# detokenized (sacremoses) -> sacrebleu against the raw reference.
#
# Usage: evaluate.sh --data-bin DIR --checkpoint FILE --src LANG --tgt LANG --ref FILE \
#                    [options] [-- EXTRA fairseq-generate args...]
#
# Papers' settings: WMT beam 4, length penalty 0.6 (--beam 4 --lenpen 0.6); the DC
# paper on IWSLT beam 6, length penalty 1.1.
#
# Checks: the reference has one line per sentence of SUBSET (a missing final newline
# counted) and no character sacrebleu would read as a line break inside a line; every hypothesis of fairseq-generate is found (its output is read as
# bytes) and put in input order; a sentence longer than the model accepts is skipped
# with a warning naming its line, gets an empty hypothesis and is counted in bleu.json
# ("skipped", "skipped_lines") and the BLEU line; every stage keeps the line count.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parse_options "$@" <<'EOF'
--data-bin DIR         DATA_BIN   dir                    required
    preprocess.sh output (with the SUBSET data for SRC-TGT)
--checkpoint FILE      CKPT       file                   required
    model to translate with (e.g. the average.sh output)
--src LANG             SRC        lang                   required
--tgt LANG             TGT        lang                   required
    language pair
--ref FILE             REF        file                   required
    raw (untokenized, unsegmented) reference for SUBSET
--subset NAME          SUBSET     text                   test
    test (default), valid, ...
--beam N               BEAM       int:1                  5
    beam size (default 5)
--lenpen X             LENPEN     float                  1.0
    length penalty (default 1.0)
--batch-size N         BATCH      int:1                  128
    sentences per batch (default 128)
--segmentation S       SEG        text                   auto
    sentencepiece, subword-nmt or none; default: the method
    recorded in DIR/SEGMENTATION by prepare_bpe.sh/preprocess.sh
--detok D              DETOK      text                   auto
    moses or none; default: DIR/TOKENIZATION, else none
--out DIR              OUT        text                   -
    outputs (default: next to the checkpoint, eval_<SUBSET>_<name>/):
    generate.out, generate.log, hyp.seg, hyp.tok, hyp.detok, bleu.json
    (built in DIR.tmp.XXXXXX, moved into DIR when all succeeded; a
    failed run leaves DIR as it was and its outputs in DIR.failed/)
--tok-bleu             TOK_BLEU   flag                   -
    also tokenized BLEU (multi-bleu.perl's number): hypothesis and
    reference Moses-tokenized (sacremoses), scored by sacrebleu with
    tokenize=none -> tok_bleu.json (same fields as bleu.json, plus
    tokenizer and compound_split), ref.tok_bleu, hyp.tok_bleu
--compound-split       COMPOUND   flag                   -
    with --tok-bleu: split hyphenated compounds in both, as in the
    usual WMT En-De evaluation: s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g
--tok-lang LANG        TOK_LANG   lang                   -
    Moses tokenizer language for --tok-bleu (default: TGT)
--breakdown SRC        BREAKDOWN  file                   -
    also BLEU by source-length bucket and by n-gram order
    (fairseq-localness-analysis bleu_breakdown) into OUT/breakdown/;
    SRC: the source side of SUBSET, one line per sentence (lengths are
    counted in its whitespace tokens: give the segmented source to
    count subwords, as the DC paper does)
--breakdown-buckets B  BUCKETS    text                   -
    bucket boundaries for --breakdown (default: 10,20,30,40,50)
-- EXTRA...            EXTRA      rest:fairseq-generate  -
    more fairseq-generate arguments
EOF

# ---- validate
[[ "$SUBSET" =~ ^[A-Za-z0-9_]+$ ]] || die "--subset: expected a split name such as test or valid, got '$SUBSET'"
require_pair "$DATA_BIN" "$SRC" "$TGT" "$SUBSET"
if [[ "$SEG" == auto ]]; then
    [[ -f "$DATA_BIN/SEGMENTATION" ]] || die "--segmentation: '$DATA_BIN' has no SEGMENTATION file \
(it was not made by preprocess.sh); expected --segmentation sentencepiece, subword-nmt or none"
    SEG="$(cat "$DATA_BIN/SEGMENTATION")"
fi
require_choice --segmentation "$SEG" sentencepiece subword-nmt none
if [[ "$DETOK" == auto ]]; then
    DETOK=none
    [[ -f "$DATA_BIN/TOKENIZATION" ]] && DETOK="$(cat "$DATA_BIN/TOKENIZATION")"
fi
require_choice --detok "$DETOK" moses none
# The reference must have one line per sentence of the binarized subset (the count
# read from the index header of fairseq's mmap format, without loading fairseq).
n_data="$("$PY" "$SCRIPTS_DIR/lines.py" count "$DATA_BIN/$SUBSET.$SRC-$TGT.$SRC.idx")"
n_ref=$(count_lines "$REF")
"$PY" "$SCRIPTS_DIR/lines.py" check --prog "$PROG" --what=--ref --reference "$REF" || exit 2
if (( n_data != n_ref )); then
    die "--ref: '$REF' has $n_ref lines but the '$SUBSET' set of '$DATA_BIN' has $n_data sentences; \
expected the reference of that set"
fi
if (( COMPOUND )) && (( ! TOK_BLEU )); then
    die "--compound-split: applies to tokenized BLEU; expected it together with --tok-bleu"
fi
if [[ -n "$TOK_LANG" ]]; then
    (( TOK_BLEU )) || die "--tok-lang: applies to tokenized BLEU; expected it together with --tok-bleu"
fi
TOK_LANG="${TOK_LANG:-$TGT}"
if [[ -n "$BREAKDOWN" ]]; then
    n_src=$(count_lines "$BREAKDOWN")
    (( n_src == n_ref )) || die "--breakdown: '$BREAKDOWN' has $n_src lines but --ref has $n_ref; expected \
the source side of the '$SUBSET' set"
fi
if [[ -n "$BUCKETS" ]]; then
    [[ -n "$BREAKDOWN" ]] || die "--breakdown-buckets: expected it together with --breakdown SRC"
    [[ "$BUCKETS" =~ ^[0-9]+(,[0-9]+)*$ ]] \
        || die "--breakdown-buckets: expected increasing whole numbers separated by commas (e.g. 10,20,30), got '$BUCKETS'"
fi
USER_DIR="$(user_dir)"
if [[ -z "$OUT" ]]; then
    name="$(basename "$CKPT")"
    OUT="$(dirname "$CKPT")/eval_${SUBSET}_${name%.pt}"
fi
[[ ! -e "$OUT" || -d "$OUT" ]] || die "--out: '$OUT' exists and is not a directory"
# everything evaluate.sh writes into --out
OUR_FILES="generate.out generate.log hyp.seg hyp.tok hyp.detok bleu.json tok_bleu.json ref.tok_bleu hyp.tok_bleu breakdown"

# ---- work, in a temporary directory next to --out whose files replace those of an
# earlier run only when everything succeeded: a failed run leaves the previous
# results as they were, and its own outputs in OUT.failed/ for a look at what went
# wrong. Other files in --out are left alone.
mkdir -p "$(dirname "$OUT")"
TMP="$(mktemp -d "${OUT%/}.tmp.XXXXXX")"
chmod 755 "$TMP"
FAILED="${OUT%/}.failed"
on_exit() {
    local status=$?
    if [[ -d "$TMP" ]]; then
        rm -rf "$FAILED"
        mv "$TMP" "$FAILED"
        echo "${PROG}: failed (exit status $status); this run's outputs are in $FAILED/, and '$OUT' was left \
as it was" >&2
    fi
}
trap on_exit EXIT

# Sentences longer than the model accepts (its maximum source or target positions)
# are skipped instead of stopping the run; their hypotheses become empty lines.
# stdout -> generate.out, stderr (its log) -> generate.log and the terminal
{ run fairseq-generate "$DATA_BIN" --user-dir "$USER_DIR" \
    --task translation --source-lang "$SRC" --target-lang "$TGT" \
    --path "$CKPT" --gen-subset "$SUBSET" --beam "$BEAM" --lenpen "$LENPEN" \
    --batch-size "$BATCH" --required-batch-size-multiple 1 --skip-invalid-size-inputs-valid-test \
    "${EXTRA[@]}" 2>&1 1>&3 3>&- | tee "$TMP/generate.log" >&2; } 3> "$TMP/generate.out"

# hypotheses back in input order (fairseq prints them in batch order), an empty line
# for each skipped sentence; the skipped ones are named on stderr
run "$PY" "$SCRIPTS_DIR/lines.py" hypotheses --prog "$PROG" --expected "$n_ref" --log "$TMP/generate.log" \
    "$TMP/generate.out" "$TMP/hyp.seg" "$TMP/skipped.json"
check_stage "hypotheses" "$n_ref" "$TMP/hyp.seg"

case "$SEG" in
    sentencepiece) run env LC_ALL=C sed -e 's/ //g' -e 's/\xe2\x96\x81/ /g' -e 's/^ *//' -e 's/ *$//' "$TMP/hyp.seg" > "$TMP/hyp.tok" ;;
    subword-nmt) run sed -E 's/(@@ )|(@@ ?$)//g' "$TMP/hyp.seg" > "$TMP/hyp.tok" ;;
    none) cp "$TMP/hyp.seg" "$TMP/hyp.tok" ;;
esac
check_stage "subword marks removed ($SEG)" "$n_ref" "$TMP/hyp.tok"
if [[ "$DETOK" == moses ]]; then
    run sacremoses -q -l "$TGT" -j 1 detokenize -x < "$TMP/hyp.tok" > "$TMP/hyp.detok"
else
    cp "$TMP/hyp.tok" "$TMP/hyp.detok"
fi
check_stage "detokenization ($DETOK)" "$n_ref" "$TMP/hyp.detok"
run sacrebleu "$REF" -i "$TMP/hyp.detok" -m bleu > "$TMP/bleu.json"
# the skipped sentences go into bleu.json: "skipped" (how many), "skipped_lines" (1-based)
"$PY" -c '
import json, sys
path, skipped = sys.argv[1], json.load(open(sys.argv[2]))
r = json.load(open(path))
r["skipped"] = len(skipped["lines"])
r["skipped_lines"] = skipped["lines"]
with open(path, "w") as f:
    json.dump(r, f, indent=1, ensure_ascii=False)
    f.write("\n")
' "$TMP/bleu.json" "$TMP/skipped.json"
rm "$TMP/skipped.json"
cat "$TMP/bleu.json"
"$PY" -c '
import json, sys
r = json.load(open(sys.argv[1]))
note = ("; %d of %s sentences skipped as too long (empty hypotheses)" % (r["skipped"], sys.argv[2])
        if r["skipped"] else "")
print("BLEU = %.2f  %s  (sacrebleu %s)%s" % (r["score"], r["verbose_score"], r["signature"], note))
' "$TMP/bleu.json" "$n_ref"

if (( TOK_BLEU )); then
    TB_ARGS=(--lang "$TOK_LANG")
    (( COMPOUND )) && TB_ARGS+=(--compound-split)
    run "$PY" "$SCRIPTS_DIR/tok_bleu.py" --ref "$REF" --hyp "$TMP/hyp.detok" "${TB_ARGS[@]}" \
        --tokenized-dir "$TMP" --output "$TMP/tok_bleu.json" > /dev/null
    "$PY" -c '
import json, sys
r = json.load(open(sys.argv[1]))
split = ", compound splitting" if r["compound_split"] else ""
print("tokenized BLEU = %.2f  %s  (%s%s; sacrebleu %s)" % (r["score"], r["verbose_score"], r["tokenizer"], split,
                                                         r["signature"]))
' "$TMP/tok_bleu.json"
fi

if [[ -n "$BREAKDOWN" ]]; then
    BD_ARGS=()
    [[ -n "$BUCKETS" ]] && BD_ARGS+=(--buckets "$BUCKETS")
    name="$(basename "$CKPT")"
    run fairseq-localness-analysis bleu_breakdown --ref "$REF" --src "$BREAKDOWN" \
        --hyp "${name%.pt}=$TMP/hyp.detok" "${BD_ARGS[@]}" --output-dir "$TMP/breakdown"
    echo "${PROG}: BLEU by source length and n-gram order in $OUT/breakdown/" >&2
fi

# ---- complete: this run's files replace those of an earlier run (all of them: one
# this run did not write, such as tok_bleu.json without --tok-bleu, is removed)
mkdir -p "$OUT"
for f in $OUR_FILES; do
    rm -rf "${OUT:?}/$f"
    if [[ -e "$TMP/$f" ]]; then
        mv "$TMP/$f" "$OUT/$f"
    fi
done
rm -rf "$TMP" "$FAILED"
