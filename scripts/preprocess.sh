#!/usr/bin/env bash
# Binarize a segmented parallel corpus for fairseq with one joined dictionary (or,
# with --joint no, one dictionary per language).
#
# Usage: preprocess.sh --data DIR --dest DIR --src LANG --tgt LANG [options] [-- EXTRA...]
#
# Checks: the two languages of each split have the same number of lines and no line
# holds a character other tools read as a line break (\r, \v, \f, U+0085, U+2028,
# U+2029, ...) or a NUL byte (prepare_bpe.sh replaces them); after fairseq-preprocess,
# the binarized data has one sentence per input line in every split and language.
#
# The segmentation model(s) and the SEGMENTATION/TOKENIZATION markers in --data
# (sentencepiece.bpe.model or code; sentencepiece.LANG.model or code.LANG) are copied
# into --dest: evaluate.sh reads them,
# and fairseq's hub interface (from_pretrained) finds the model there.
# --dest is built under a temporary name and renamed at the end (complete or absent).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parse_options "$@" <<'EOF'
--data DIR      DATA     dir                      required
    segmented text (prepare_bpe.sh --out): DIR/{train,valid,test}.{SRC,TGT}
--dest DIR      DEST     text                     required
    the fairseq data directory to create (the "data-bin")
--src LANG      SRC      lang                     required
--tgt LANG      TGT      lang                     required
    language codes
--splits LIST   SPLITS   text                     train,valid,test
    train,valid,test (default); valid and test are optional names
    of fairseq-preprocess's --validpref/--testpref, train is required
--joint yes|no  JOINT    choice:yes|no            yes
    one dictionary for both languages (yes, the default:
    fairseq-preprocess --joined-dictionary) or one per language (no)
--workers N     WORKERS  int:1                    2
    fairseq-preprocess workers (default 2)
--force         FORCE    flag                     -
    replace an existing --dest directory (never a file)
-- EXTRA...     EXTRA    rest:fairseq-preprocess  -
    passed to fairseq-preprocess as they are
EOF

# ---- validate
[[ "$SRC" != "$TGT" ]] || die "--src and --tgt must differ, both are '$SRC'"
IFS=, read -r -a SPLIT_LIST <<< "$SPLITS"
PREFS=()
for split in "${SPLIT_LIST[@]}"; do
    case "$split" in
        train) PREFS+=(--trainpref "$DATA/train") ;;
        valid) PREFS+=(--validpref "$DATA/valid") ;;
        test) PREFS+=(--testpref "$DATA/test") ;;
        *) die "--splits: expected a comma-separated subset of train,valid,test; got '$split'" ;;
    esac
    for lang in "$SRC" "$TGT"; do
        require_file "$DATA/$split.$lang" "--data/--src/--tgt ($split data for $SRC-$TGT)"
    done
done
[[ ",$SPLITS," == *,train,* ]] || die "--splits: must include train (the dictionary is built from it), got '$SPLITS'"
[[ ! -e "$DEST" || -d "$DEST" ]] || die "--dest: '$DEST' exists and is not a directory; expected a new directory \
(--force replaces a directory, never a file)"
if [[ -e "$DEST" && $FORCE -eq 0 ]]; then
    die "--dest: '$DEST' already exists; expected a new directory (or pass --force to replace it)"
fi
for split in "${SPLIT_LIST[@]}"; do
    "$PY" "$SCRIPTS_DIR/lines.py" check --prog "$PROG" --what "--data ($split data for $SRC-$TGT)" \
        "$DATA/$split.$SRC" "$DATA/$split.$TGT" || exit 2
done

# ---- work
mkdir -p "$(dirname "$DEST")"
TMP="$(mktemp -d "${DEST%/}.tmp.XXXXXX")"
chmod 755 "$TMP"
trap 'rm -rf "$TMP"' EXIT

DICT_ARGS=()
[[ "$JOINT" == yes ]] && DICT_ARGS=(--joined-dictionary)
run fairseq-preprocess --source-lang "$SRC" --target-lang "$TGT" "${PREFS[@]}" \
    --destdir "$TMP" "${DICT_ARGS[@]}" --workers "$WORKERS" "${EXTRA[@]}"
IDX=()
for split in "${SPLIT_LIST[@]}"; do
    for lang in "$SRC" "$TGT"; do
        IDX+=("$TMP/$split.$SRC-$TGT.$lang.idx")
        [[ -f "${IDX[-1]}" ]] || die "fairseq-preprocess wrote no $split data for $lang (expected ${IDX[-1]})"
    done
done
mapfile -t N_BIN < <("$PY" "$SCRIPTS_DIR/lines.py" count "${IDX[@]}")
i=0
for split in "${SPLIT_LIST[@]}"; do
    n_in=$(count_lines "$DATA/$split.$SRC")
    for lang in "$SRC" "$TGT"; do
        (( ${N_BIN[i]:-0} == n_in )) || die "fairseq-preprocess: binarized ${N_BIN[i]:-no} sentences of \
'$DATA/$split.$lang' for its $n_in lines; the languages would not be aligned, stopping (nothing was written to --dest)"
        i=$((i + 1))
    done
done
for f in sentencepiece.bpe.model code "sentencepiece.$SRC.model" "sentencepiece.$TGT.model" "code.$SRC" \
         "code.$TGT" SEGMENTATION TOKENIZATION; do
    if [[ -f "$DATA/$f" ]]; then
        cp "$DATA/$f" "$TMP/$f"
    fi
done

rm -rf "$DEST"
mv "$TMP" "$DEST"
trap - EXIT
echo "${PROG}: wrote $DEST" >&2
