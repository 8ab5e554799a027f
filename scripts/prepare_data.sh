#!/usr/bin/env bash
# Prepare one of the papers' datasets from a local copy of its original download:
# extract, clean and split (fairseq-localness-prepare), learn and apply the subword
# model(s) (prepare_bpe.sh), binarize (preprocess.sh). Each dataset is described by
# its manifest, data/manifests/NAME.json (files, URLs, sizes and checksums, splits,
# licence, the tables that use it); docs/data.md explains every dataset.
#
# Usage: prepare_data.sh --dataset NAME [--raw-dir DIR] [--out DIR] [options]
#
# An existing --out that PREPARED shows to hold the same dataset, direction, --bpe and
# --bpe-size is left as it is (the script says so and exits 0); any other existing
# --out is an error unless --force is given. The output is built in a temporary
# directory next to --out and renamed at the end, so --out is complete or unchanged.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parse_options "$@" <<'EOF'
--dataset NAME      DATASET     text                              required
    wmt14_en_de, iwslt14_de_en, iwslt14_es_en, iwslt14_ro_en,
    iwslt15_en_vi, iwslt15_fr_en, wat17_ja_en or wmt17_zh_en
--raw-dir DIR       RAW         text                              -
    the original archives/files under their original names, one
    directory per dataset (default: data/downloads/NAME; a missing file
    stops the script, listing what it expected and where to get it)
--out DIR           OUT         text                              -
    (default: data/prepared/NAME[-VARIANT].SRC-TGT.BPE SIZE[.separate])
    the prepared dataset: raw/{train,valid,test}.{SRC,TGT} (cleaned,
    untokenized; raw/test.TGT is the sacrebleu reference), seg/
    (word-segmented; Japanese and Chinese only), bpe/ (prepare_bpe.sh),
    bin/ (the fairseq data-bin), PREPARED (JSON record of the request,
    split sizes and settings)
--variant V         VARIANT     text                              -
    the dataset's variant of splits and casing, where it has several
    (iwslt14_de_en: paper, the default, Song et al.'s test set with case
    kept; fairseq, fairseq's split, lowercased)
--src LANG          SRC         lang                              -
--tgt LANG          TGT         lang                              -
    the direction (default: the name's order, e.g. de->en for
    iwslt14_de_en); the reverse direction is the only other choice
--bpe M             BPE         choice:subword-nmt|sentencepiece  -
    subword-nmt or sentencepiece (default: the dataset's, see docs/data.md);
    subword-nmt runs on Moses-tokenized text, sentencepiece on raw text
--bpe-size N        BPE_SIZE    int:1                             -
    merges (subword-nmt) or vocabulary size (sentencepiece);
    default: the dataset's (e.g. 32000 for WMT14, 10000 for IWSLT14 De-En)
--bpe-joint yes|no  BPE_JOINT   choice:yes|no                     -
    one subword model and dictionary for both languages (yes), or one
    of each per language with --bpe-size each (no); default: the
    dataset's (no for wat17_ja_en and wmt17_zh_en, yes for the others)
--download          DOWNLOAD    flag                              -
    download the missing files into --raw-dir first, with progress
    bars, checked against the published sizes and checksums (not
    possible for ASPEC, CWMT and the WIT3 releases: see docs/data.md)
--check             CHECK_ONLY  flag                              -
    check everything (options, raw files, tools), print the resolved
    settings and exit: 0 if preparing would start, 2 if not
--workers N         WORKERS     int:1                             2
    processes for cleaning/segmentation and fairseq-preprocess (default 2)
--force             FORCE       flag                              -
    replace an existing --out
EOF

# ---- validate everything before doing anything
REQUEST=(--dataset "$DATASET")
[[ -z "$RAW" ]] || REQUEST+=(--raw-dir "$RAW")
[[ -z "$OUT" ]] || REQUEST+=(--out "$OUT")
[[ -z "$VARIANT" ]] || REQUEST+=(--variant "$VARIANT")
[[ -z "$SRC" ]] || REQUEST+=(--src "$SRC")
[[ -z "$TGT" ]] || REQUEST+=(--tgt "$TGT")
[[ -z "$BPE" ]] || REQUEST+=(--bpe "$BPE")
[[ -z "$BPE_SIZE" ]] || REQUEST+=(--bpe-size "$BPE_SIZE")
[[ -z "$BPE_JOINT" ]] || REQUEST+=(--bpe-joint "$BPE_JOINT")
CHECK=()
(( DOWNLOAD )) && CHECK+=(--download)
(( FORCE )) && CHECK+=(--force)
# dataset, direction, raw files, --out, segmentation tools: exit 2 with the message
# of fairseq-localness-prepare (run without importing fairseq: scripts/prepare_data.py)
PREP=("$PY" "$SCRIPTS_DIR/prepare_data.py" --prog "$PROG")
settings="$("${PREP[@]}" check "${REQUEST[@]}" "${CHECK[@]}")" || exit $?
STATUS="" MISSING=0 BPE_INPUT=raw TOKENIZE=none
eval "$settings"
if (( CHECK_ONLY )); then
    echo "$settings"
    exit 0
fi
if [[ "$STATUS" == prepared ]]; then
    echo "${PROG}: $OUT already holds $DATASET prepared with these settings (see $OUT/PREPARED); nothing to do (--force redoes it)" >&2
    exit 0
fi
if [[ "$BPE" == sentencepiece ]]; then
    BPE_OPTS=(--method sentencepiece --vocab-size "$BPE_SIZE")
else
    BPE_OPTS=(--method subword-nmt --merges "$BPE_SIZE")
fi

# ---- work
if (( DOWNLOAD && MISSING > 0 )); then
    run "${PREP[@]}" download --dataset "$DATASET" --raw-dir "$RAW"
fi
RAW_ARGS=(--raw-dir "$RAW" --bpe-joint "$BPE_JOINT")
[[ -z "$VARIANT" ]] || RAW_ARGS+=(--variant "$VARIANT")
mkdir -p "$(dirname "$OUT")"
TMP="$(mktemp -d "${OUT%/}.tmp.XXXXXX")"
chmod 755 "$TMP"
trap 'rm -rf "$TMP"' EXIT

run "${PREP[@]}" raw --dataset "$DATASET" "${RAW_ARGS[@]}" --out "$TMP" --src "$SRC" --tgt "$TGT" \
    --bpe "$BPE" --bpe-size "$BPE_SIZE" --workers "$WORKERS"
run bash "$SCRIPTS_DIR/prepare_bpe.sh" --raw "$TMP/$BPE_INPUT" --out "$TMP/bpe" --src "$SRC" --tgt "$TGT" \
    "${BPE_OPTS[@]}" --tokenize "$TOKENIZE" --joint "$BPE_JOINT"
run bash "$SCRIPTS_DIR/preprocess.sh" --data "$TMP/bpe" --dest "$TMP/bin" --src "$SRC" --tgt "$TGT" \
    --workers "$WORKERS" --joint "$BPE_JOINT"

# Another run (e.g. a second reproduce script) may have prepared the same request in the
# meantime and be reading it: keep that one rather than replacing it under its feet.
if [[ "$STATUS" == new && -e "$OUT" ]]; then
    now="$("${PREP[@]}" check "${REQUEST[@]}" 2>/dev/null || true)"
    if grep -qx 'STATUS=prepared' <<< "$now"; then
        echo "${PROG}: $OUT was prepared with these settings by another run meanwhile; keeping it (this run's copy is discarded)" >&2
        exit 0
    fi
    die "--out: '$OUT' was created by another run while this one prepared the data; it is left as it is and \
this run's result is discarded (rerun with --force to replace it)"
fi
rm -rf "$OUT"
mv "$TMP" "$OUT"
trap - EXIT
echo "${PROG}: wrote $OUT ($DATASET${VARIANT:+ ($VARIANT)} $SRC->$TGT, $BPE $BPE_SIZE$([[ "$BPE_JOINT" == no ]] && echo ", one model per language"); data-bin $OUT/bin, reference $OUT/raw/test.$TGT)" >&2
