#!/usr/bin/env bash
# Tokenize (optional) and segment a raw parallel corpus into subwords with one joint
# model learned on the training data of both languages (or, with --joint no, one
# model per language learned on its own side).
#
# Usage: prepare_bpe.sh --raw DIR --out DIR --src LANG --tgt LANG [options]
#
# Checks: the raw files of each split have the same number of lines (a missing final
# newline does not count as a missing line); every line has its line-breaking
# characters other than \n (\r, \v, \f, U+0085, U+2028, U+2029, ...) and NUL bytes
# replaced by a space first (scripts/lines.py, which says which lines it changed),
# because the tokenizer, the subword tools and fairseq-preprocess would read them as
# line breaks and shift every later line; after every stage (normalization,
# tokenization, segmentation) each file must still have its input's number of lines.
# The output is built in a temporary directory next to --out and renamed at the end,
# so --out is either complete or absent.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parse_options "$@" <<'EOF'
--raw DIR       RAW       dir                               required
    raw text: DIR/{train,valid,test}.{SRC,TGT}, one sentence a line
--out DIR       OUT       text                              required
    where the segmented files go (same names), plus the model:
    sentencepiece.bpe.model or code (--joint no: sentencepiece.SRC.model
    and sentencepiece.TGT.model, or code.SRC and code.TGT), and
    SEGMENTATION (the method)
--src LANG      SRC       lang                              required
--tgt LANG      TGT       lang                              required
    language codes (file suffixes)
--method M      METHOD    choice:sentencepiece|subword-nmt  sentencepiece
    sentencepiece (default) or subword-nmt
--vocab-size N  VOCAB     int:16                            8000
    sentencepiece vocabulary size (default 8000; capped on small data)
--merges N      MERGES    int:1                             32000
    subword-nmt merge operations (default 32000)
--tokenize T    TOKENIZE  choice:moses|none                 none
    moses (sacremoses, language-specific rules) or none (default;
    right for sentencepiece, which needs no pre-tokenization)
--joint yes|no  JOINT     choice:yes|no                     yes
    one model learned on both languages (yes, the default) or one per
    language with the same --vocab-size/--merges each (distant pairs
    such as Zh-En and Ja-En share few subwords)
--splits LIST   SPLITS    text                              train,valid,test
    comma-separated splits to segment (default train,valid,test;
    the model is always learned on train)
--force         FORCE     flag                              -
    replace an existing --out directory (never a file)
EOF

# ---- validate everything before doing anything
[[ "$SRC" != "$TGT" ]] || die "--src and --tgt must differ, both are '$SRC'"
IFS=, read -r -a SPLIT_LIST <<< "$SPLITS"
(( ${#SPLIT_LIST[@]} )) || die "--splits: expected a comma-separated list of splits, got '$SPLITS'"
[[ ",$SPLITS," == *,train,* ]] || die "--splits: must include train (the model is learned on it), got '$SPLITS'"
for split in "${SPLIT_LIST[@]}"; do
    [[ "$split" =~ ^[A-Za-z0-9_]+$ ]] || die "--splits: '$split' is not a valid split name"
    for lang in "$SRC" "$TGT"; do
        require_file "$RAW/$split.$lang" "--raw/--src/--tgt ($split data for $SRC-$TGT)"
    done
    n_src=$(count_lines "$RAW/$split.$SRC")
    n_tgt=$(count_lines "$RAW/$split.$TGT")
    (( n_src == n_tgt )) || die "--raw: $RAW/$split.$SRC has $n_src lines but $RAW/$split.$TGT has $n_tgt; expected parallel files"
    declare "LINES_$split=$n_src"
done
[[ ! -e "$OUT" || -d "$OUT" ]] || die "--out: '$OUT' exists and is not a directory; expected a new directory \
(--force replaces a directory, never a file)"
if [[ -e "$OUT" && $FORCE -eq 0 ]]; then
    die "--out: '$OUT' already exists; expected a new directory (or pass --force to replace it)"
fi
if [[ "$METHOD" == subword-nmt ]]; then
    command -v subword-nmt >/dev/null || die "--method subword-nmt: the subword-nmt command is not installed (make install)"
fi
if [[ "$TOKENIZE" == moses ]]; then
    command -v sacremoses >/dev/null || die "--tokenize moses: the sacremoses command is not installed (make install)"
fi

# ---- work
mkdir -p "$(dirname "$OUT")"
TMP="$(mktemp -d "${OUT%/}.tmp.XXXXXX")"
chmod 755 "$TMP"
trap 'rm -rf "$TMP"' EXIT

# 0. line-breaking characters and NUL bytes -> spaces, one \n-terminated line per line
NORM_ARGS=()
for split in "${SPLIT_LIST[@]}"; do
    for lang in "$SRC" "$TGT"; do
        NORM_ARGS+=("$RAW/$split.$lang" "$TMP/$split.norm.$lang")
    done
done
run "$PY" "$SCRIPTS_DIR/lines.py" normalize --prog "$PROG" "${NORM_ARGS[@]}"
lines_of() { local v="LINES_$1"; echo "${!v}"; }
for split in "${SPLIT_LIST[@]}"; do
    check_stage "normalization" "$(lines_of "$split")" "$TMP/$split.norm.$SRC" "$TMP/$split.norm.$TGT"
done

# 1. tokenization (or the normalized text as it is), per split and language
for split in "${SPLIT_LIST[@]}"; do
    for lang in "$SRC" "$TGT"; do
        if [[ "$TOKENIZE" == moses ]]; then
            run sacremoses -q -l "$lang" -j 1 tokenize -a -x < "$TMP/$split.norm.$lang" > "$TMP/$split.tok.$lang"
        else
            mv "$TMP/$split.norm.$lang" "$TMP/$split.tok.$lang"  # nothing to tokenize
        fi
    done
    check_stage "tokenization ($TOKENIZE)" "$(lines_of "$split")" "$TMP/$split.tok.$SRC" "$TMP/$split.tok.$TGT"
done
rm -f "$TMP"/*.norm.*

# 2. learn one joint model on train (both languages), 3. apply it to every split;
# --joint no: one model per language, learned on and applied to that language only
if [[ "$JOINT" == no ]]; then
    for lang in "$SRC" "$TGT"; do
        if [[ "$METHOD" == sentencepiece ]]; then
            run "$PY" "$SCRIPTS_DIR/spm.py" train --input "$TMP/train.tok.$lang" \
                --model-prefix "$TMP/sentencepiece.$lang" --vocab-size "$VOCAB"
        else
            run subword-nmt learn-bpe -s "$MERGES" --input "$TMP/train.tok.$lang" --output "$TMP/code.$lang"
        fi
        for split in "${SPLIT_LIST[@]}"; do
            if [[ "$METHOD" == sentencepiece ]]; then
                run "$PY" "$SCRIPTS_DIR/spm.py" encode --model "$TMP/sentencepiece.$lang.model" \
                    < "$TMP/$split.tok.$lang" > "$TMP/$split.$lang"
            else
                run subword-nmt apply-bpe -c "$TMP/code.$lang" --input "$TMP/$split.tok.$lang" --output "$TMP/$split.$lang"
            fi
        done
    done
    rm -f "$TMP"/sentencepiece.*.vocab
elif [[ "$METHOD" == sentencepiece ]]; then
    run "$PY" "$SCRIPTS_DIR/spm.py" train --input "$TMP/train.tok.$SRC" "$TMP/train.tok.$TGT" \
        --model-prefix "$TMP/sentencepiece.bpe" --vocab-size "$VOCAB"
    for split in "${SPLIT_LIST[@]}"; do
        for lang in "$SRC" "$TGT"; do
            run "$PY" "$SCRIPTS_DIR/spm.py" encode --model "$TMP/sentencepiece.bpe.model" \
                < "$TMP/$split.tok.$lang" > "$TMP/$split.$lang"
        done
        check_stage "segmentation (sentencepiece)" "$(lines_of "$split")" "$TMP/$split.$SRC" "$TMP/$split.$TGT"
    done
else
    cat "$TMP/train.tok.$SRC" "$TMP/train.tok.$TGT" > "$TMP/train.tok.joint"
    run subword-nmt learn-bpe -s "$MERGES" --input "$TMP/train.tok.joint" --output "$TMP/code"
    rm "$TMP/train.tok.joint"
    for split in "${SPLIT_LIST[@]}"; do
        for lang in "$SRC" "$TGT"; do
            run subword-nmt apply-bpe -c "$TMP/code" --input "$TMP/$split.tok.$lang" --output "$TMP/$split.$lang"
        done
        check_stage "segmentation (subword-nmt)" "$(lines_of "$split")" "$TMP/$split.$SRC" "$TMP/$split.$TGT"
    done
fi
rm -f "$TMP"/*.tok.*
printf '%s\n' "$METHOD" > "$TMP/SEGMENTATION"
printf '%s\n' "$TOKENIZE" > "$TMP/TOKENIZATION"

rm -rf "$OUT"
mv "$TMP" "$OUT"
trap - EXIT
echo "${PROG}: wrote $OUT ($METHOD, joint=$JOINT, tokenize=$TOKENIZE)" >&2
