#!/usr/bin/env bash
# Translate a binarized test set and score it with sacrebleu (signature printed):
# fairseq-generate -> hypotheses in input order -> subword marks removed ->
# detokenized (sacremoses) -> sacrebleu against the raw reference.
#
# Usage: evaluate.sh --data-bin DIR --checkpoint FILE --src LANG --tgt LANG --ref FILE \
#                    [options] [-- EXTRA fairseq-generate args...]
#
#   --data-bin DIR      preprocess.sh output (with the SUBSET data for SRC-TGT)
#   --checkpoint FILE   model to translate with (e.g. the average.sh output)
#   --src, --tgt        language pair
#   --ref FILE          raw (untokenized, unsegmented) reference for SUBSET
#   --subset NAME       test (default), valid, ...
#   --beam N            beam size (default 5)
#   --lenpen X          length penalty (default 1.0)
#   --batch-size N      sentences per batch (default 128)
#   --segmentation S    sentencepiece, subword-nmt or none; default: the method
#                       recorded in DIR/SEGMENTATION by prepare_bpe.sh/preprocess.sh
#   --detok D           moses or none; default: DIR/TOKENIZATION, else none
#   --out DIR           outputs (default: next to the checkpoint, eval_<SUBSET>_<name>/):
#                       generate.out, hyp.seg, hyp.tok, hyp.detok, bleu.json
#   --tok-bleu          also tokenized BLEU (multi-bleu.perl's number): hypothesis and
#                       reference Moses-tokenized (sacremoses), scored by sacrebleu with
#                       tokenize=none -> tok_bleu.json (same fields as bleu.json, plus
#                       tokenizer and compound_split), ref.tok_bleu, hyp.tok_bleu
#   --compound-split    with --tok-bleu: split hyphenated compounds in both, as in the
#                       usual WMT En-De evaluation: s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g
#   --tok-lang LANG     Moses tokenizer language for --tok-bleu (default: TGT)
#   --breakdown SRC     also BLEU by source-length bucket and by n-gram order
#                       (fairseq-localness-analysis bleu_breakdown) into OUT/breakdown/;
#                       SRC: the source side of SUBSET, one line per sentence (lengths are
#                       counted in its whitespace tokens: give the segmented source to
#                       count subwords, as the DC paper does)
#   --breakdown-buckets B   bucket boundaries for --breakdown (default: 10,20,30,40,50)
#
# Papers' settings: WMT beam 4, length penalty 0.6 (--beam 4 --lenpen 0.6); the DC
# paper on IWSLT beam 6, length penalty 1.1.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DATA_BIN="" CKPT="" SRC="" TGT="" REF="" SUBSET=test BEAM=5 LENPEN=1.0 BATCH=128
SEG=auto DETOK=auto OUT="" TOK_BLEU=0 COMPOUND=0 TOK_LANG="" BREAKDOWN="" BUCKETS=""
EXTRA=()
while (( $# )); do
    case "$1" in
        --data-bin) need_value "$1" $#; DATA_BIN="$2"; shift 2 ;;
        --checkpoint) need_value "$1" $#; CKPT="$2"; shift 2 ;;
        --src) need_value "$1" $#; SRC="$2"; shift 2 ;;
        --tgt) need_value "$1" $#; TGT="$2"; shift 2 ;;
        --ref) need_value "$1" $#; REF="$2"; shift 2 ;;
        --subset) need_value "$1" $#; SUBSET="$2"; shift 2 ;;
        --beam) need_value "$1" $#; BEAM="$2"; shift 2 ;;
        --lenpen) need_value "$1" $#; LENPEN="$2"; shift 2 ;;
        --batch-size) need_value "$1" $#; BATCH="$2"; shift 2 ;;
        --segmentation) need_value "$1" $#; SEG="$2"; shift 2 ;;
        --detok) need_value "$1" $#; DETOK="$2"; shift 2 ;;
        --out) need_value "$1" $#; OUT="$2"; shift 2 ;;
        --tok-bleu) TOK_BLEU=1; shift ;;
        --compound-split) COMPOUND=1; shift ;;
        --tok-lang) need_value "$1" $#; TOK_LANG="$2"; shift 2 ;;
        --breakdown) need_value "$1" $#; BREAKDOWN="$2"; shift 2 ;;
        --breakdown-buckets) need_value "$1" $#; BUCKETS="$2"; shift 2 ;;
        --) shift; EXTRA=("$@"); break ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option '$1' (see '${PROG} --help'; fairseq-generate options go after --)" ;;
    esac
done

# ---- validate
require_value --data-bin "$DATA_BIN"
require_value --checkpoint "$CKPT"
require_value --src "$SRC"
require_value --tgt "$TGT"
require_value --ref "$REF"
require_lang --src "$SRC"
require_lang --tgt "$TGT"
[[ "$SUBSET" =~ ^[A-Za-z0-9_]+$ ]] || die "--subset: expected a split name such as test or valid, got '$SUBSET'"
require_int --beam "$BEAM" 1
require_float --lenpen "$LENPEN"
require_int --batch-size "$BATCH" 1
require_pair "$DATA_BIN" "$SRC" "$TGT" "$SUBSET"
require_file "$CKPT" --checkpoint
require_file "$REF" --ref
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
# The reference must have one line per sentence of the binarized subset (read from
# the index header of fairseq's mmap format, without loading fairseq).
n_data="$("$PY" -c '
import struct, sys
with open(sys.argv[1], "rb") as f:
    magic = f.read(9)
    if magic != b"MMIDIDX\x00\x00":
        sys.exit(0)  # another dataset format: not checked here
    f.read(8 + 1)  # version, dtype
    print(struct.unpack("<Q", f.read(8))[0])
' "$DATA_BIN/$SUBSET.$SRC-$TGT.$SRC.idx")"
n_ref=$(wc -l < "$REF")
if [[ -n "$n_data" ]] && (( n_data != n_ref )); then
    die "--ref: '$REF' has $n_ref lines but the '$SUBSET' set of '$DATA_BIN' has $n_data sentences; \
expected the reference of that set"
fi
if (( COMPOUND )) && (( ! TOK_BLEU )); then
    die "--compound-split: applies to tokenized BLEU; expected it together with --tok-bleu"
fi
if [[ -n "$TOK_LANG" ]]; then
    (( TOK_BLEU )) || die "--tok-lang: applies to tokenized BLEU; expected it together with --tok-bleu"
    require_lang --tok-lang "$TOK_LANG"
fi
TOK_LANG="${TOK_LANG:-$TGT}"
if [[ -n "$BREAKDOWN" ]]; then
    require_file "$BREAKDOWN" --breakdown
    n_src=$(wc -l < "$BREAKDOWN")
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

# ---- work
mkdir -p "$OUT"
run fairseq-generate "$DATA_BIN" --user-dir "$USER_DIR" \
    --task translation --source-lang "$SRC" --target-lang "$TGT" \
    --path "$CKPT" --gen-subset "$SUBSET" --beam "$BEAM" --lenpen "$LENPEN" \
    --batch-size "$BATCH" --required-batch-size-multiple 1 "${EXTRA[@]}" > "$OUT/generate.out"

# hypotheses back in input order (fairseq prints them in batch order)
grep '^H-' "$OUT/generate.out" | sed 's/^H-//' | sort -n -k1,1 | cut -f3 > "$OUT/hyp.seg"
n_hyp=$(wc -l < "$OUT/hyp.seg")
(( n_hyp == n_ref )) || die "fairseq-generate produced $n_hyp hypotheses for $n_ref reference lines (see $OUT/generate.out)"

case "$SEG" in
    sentencepiece) run env LC_ALL=C sed -e 's/ //g' -e 's/\xe2\x96\x81/ /g' -e 's/^ *//' -e 's/ *$//' "$OUT/hyp.seg" > "$OUT/hyp.tok" ;;
    subword-nmt) run sed -E 's/(@@ )|(@@ ?$)//g' "$OUT/hyp.seg" > "$OUT/hyp.tok" ;;
    none) run cp "$OUT/hyp.seg" "$OUT/hyp.tok" ;;
esac
if [[ "$DETOK" == moses ]]; then
    run sacremoses -q -l "$TGT" -j 1 detokenize -x < "$OUT/hyp.tok" > "$OUT/hyp.detok"
else
    run cp "$OUT/hyp.tok" "$OUT/hyp.detok"
fi
run sacrebleu "$REF" -i "$OUT/hyp.detok" -m bleu > "$OUT/bleu.json"
cat "$OUT/bleu.json"
"$PY" -c '
import json, sys
r = json.load(open(sys.argv[1]))
print("BLEU = %.2f  %s  (sacrebleu %s)" % (r["score"], r["verbose_score"], r["signature"]))
' "$OUT/bleu.json"

if (( TOK_BLEU )); then
    TB_ARGS=(--lang "$TOK_LANG")
    (( COMPOUND )) && TB_ARGS+=(--compound-split)
    run "$PY" "$SCRIPTS_DIR/tok_bleu.py" --ref "$REF" --hyp "$OUT/hyp.detok" "${TB_ARGS[@]}" \
        --tokenized-dir "$OUT" --output "$OUT/tok_bleu.json" > /dev/null
    "$PY" -c '
import json, sys
r = json.load(open(sys.argv[1]))
split = ", compound splitting" if r["compound_split"] else ""
print("tokenized BLEU = %.2f  %s  (%s%s; sacrebleu %s)" % (r["score"], r["verbose_score"], r["tokenizer"], split,
                                                         r["signature"]))
' "$OUT/tok_bleu.json"
fi

if [[ -n "$BREAKDOWN" ]]; then
    BD_TMP="$(mktemp -d "$OUT/breakdown.tmp.XXXXXX")"
    trap 'rm -rf "$BD_TMP"' EXIT
    BD_ARGS=()
    [[ -n "$BUCKETS" ]] && BD_ARGS+=(--buckets "$BUCKETS")
    name="$(basename "$CKPT")"
    run fairseq-localness-analysis bleu_breakdown --ref "$REF" --src "$BREAKDOWN" \
        --hyp "${name%.pt}=$OUT/hyp.detok" "${BD_ARGS[@]}" --output-dir "$BD_TMP"
    chmod 755 "$BD_TMP"
    rm -rf "$OUT/breakdown"
    mv "$BD_TMP" "$OUT/breakdown"
    trap - EXIT
    echo "${PROG}: BLEU by source length and n-gram order in $OUT/breakdown/" >&2
fi
