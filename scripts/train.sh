#!/usr/bin/env bash
# Train a translation model with fairseq-train, with fairseq_localness as --user-dir.
#
# Usage: train.sh --arch ARCH --data-bin DIR --save-dir DIR --max-update N \
#                 --src LANG --tgt LANG [--seed N] [-- EXTRA fairseq-train args...]
#
#   --arch ARCH       any registered architecture: fairseq's (transformer, ...) or
#                     this package's (localness_transformer, hybrid_transformer, ...)
#   --data-bin DIR    preprocess.sh output with train and valid data for SRC-TGT
#   --save-dir DIR    checkpoints go here; if it holds checkpoint_last.pt, training
#                     resumes from it (fairseq's behaviour)
#   --max-update N    number of updates to train for
#   --src, --tgt      language pair
#   --seed N          random seed (default 1)
#   -- EXTRA...       more fairseq-train arguments. They come after the defaults
#                     below, and for an option given twice the later value wins, so
#                     EXTRA can override any default.
#
# Defaults (the Transformer-base recipe of fairseq's translation examples):
#   --optimizer adam --adam-betas '(0.9,0.98)' --clip-norm 0.0 --lr 5e-4
#   --lr-scheduler inverse_sqrt --warmup-updates 4000 --dropout 0.3
#   --weight-decay 0.0001 --criterion label_smoothed_cross_entropy
#   --label-smoothing 0.1 --max-tokens 4096 --log-format simple --log-interval 100
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ARCH="" DATA_BIN="" SAVE_DIR="" MAX_UPDATE="" SRC="" TGT="" SEED=1
EXTRA=()
while (( $# )); do
    case "$1" in
        --arch) need_value "$1" $#; ARCH="$2"; shift 2 ;;
        --data-bin) need_value "$1" $#; DATA_BIN="$2"; shift 2 ;;
        --save-dir) need_value "$1" $#; SAVE_DIR="$2"; shift 2 ;;
        --max-update) need_value "$1" $#; MAX_UPDATE="$2"; shift 2 ;;
        --src) need_value "$1" $#; SRC="$2"; shift 2 ;;
        --tgt) need_value "$1" $#; TGT="$2"; shift 2 ;;
        --seed) need_value "$1" $#; SEED="$2"; shift 2 ;;
        --) shift; EXTRA=("$@"); break ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option '$1' (see '${PROG} --help'; fairseq-train options go after --)" ;;
    esac
done

# ---- validate (cheap checks first; the architecture check imports fairseq)
require_value --arch "$ARCH"
require_value --data-bin "$DATA_BIN"
require_value --save-dir "$SAVE_DIR"
require_value --max-update "$MAX_UPDATE"
require_value --src "$SRC"
require_value --tgt "$TGT"
require_lang --src "$SRC"
require_lang --tgt "$TGT"
require_int --max-update "$MAX_UPDATE" 1
require_int --seed "$SEED" 0
require_pair "$DATA_BIN" "$SRC" "$TGT" train valid
[[ ! -e "$SAVE_DIR" || -d "$SAVE_DIR" ]] || die "--save-dir: '$SAVE_DIR' exists and is not a directory"
USER_DIR="$(user_dir)"
check_arch "$ARCH"

if [[ -f "$SAVE_DIR/checkpoint_last.pt" ]]; then
    echo "${PROG}: resuming from $SAVE_DIR/checkpoint_last.pt" >&2
fi

# ---- work
run fairseq-train "$DATA_BIN" \
    --user-dir "$USER_DIR" \
    --task translation --source-lang "$SRC" --target-lang "$TGT" \
    --arch "$ARCH" \
    --optimizer adam --adam-betas '(0.9,0.98)' --clip-norm 0.0 --lr 5e-4 \
    --lr-scheduler inverse_sqrt --warmup-updates 4000 --dropout 0.3 \
    --weight-decay 0.0001 --criterion label_smoothed_cross_entropy \
    --label-smoothing 0.1 --max-tokens 4096 --log-format simple --log-interval 100 \
    --seed "$SEED" --max-update "$MAX_UPDATE" --save-dir "$SAVE_DIR" \
    "${EXTRA[@]}"
