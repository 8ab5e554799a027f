#!/usr/bin/env bash
# Average the last N checkpoints of a training run (fairseq-localness-average).
#
# Usage: average.sh --save-dir DIR --last N [--by update|epoch] [--output FILE]
#
#   --save-dir DIR    the training run's checkpoint directory
#   --last N          how many checkpoints to average. The papers (after Vaswani et al.
#                     2017): --last 5 for Transformer-base models, --last 20 for big
#                     ones, of checkpoints saved at regular intervals (--by update with
#                     fairseq-train --save-interval-updates, e.g. every 1000 updates)
#   --by update       average checkpoint_<epoch>_<update>.pt files (written with
#                     fairseq-train --save-interval-updates); --by epoch (the default)
#                     averages checkpoint<epoch>.pt files
#   --output FILE     default: DIR/checkpoint_avg_last<N>.pt
#
# The average is written to a temporary file and renamed; an existing output is
# replaced only by a complete new file, and an input is never overwritten.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SAVE_DIR="" LAST="" BY=epoch OUTPUT=""
while (( $# )); do
    case "$1" in
        --save-dir) need_value "$1" $#; SAVE_DIR="$2"; shift 2 ;;
        --last) need_value "$1" $#; LAST="$2"; shift 2 ;;
        --by) need_value "$1" $#; BY="$2"; shift 2 ;;
        --output) need_value "$1" $#; OUTPUT="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option '$1' (see '${PROG} --help')" ;;
    esac
done

require_value --save-dir "$SAVE_DIR"
require_value --last "$LAST"
require_int --last "$LAST" 1
require_choice --by "$BY" update epoch
require_dir "$SAVE_DIR" --save-dir
OUTPUT="${OUTPUT:-$SAVE_DIR/checkpoint_avg_last$LAST.pt}"
if [[ "$BY" == update ]]; then
    pattern='^checkpoint_[0-9]+_[0-9]+\.pt$' form='checkpoint_<epoch>_<update>.pt'
else
    pattern='^checkpoint[0-9]+\.pt$' form='checkpoint<epoch>.pt'
fi
found=$(ls "$SAVE_DIR" | grep -cE "$pattern" || true)
(( found >= LAST )) || die "--save-dir '$SAVE_DIR' has $found checkpoint(s) named $form, --last asks for $LAST \
(for update checkpoints train with --save-interval-updates and use --by update)"

if [[ "$BY" == update ]]; then
    run fairseq-localness-average --inputs "$SAVE_DIR" --num-update-checkpoints "$LAST" --output "$OUTPUT"
else
    run fairseq-localness-average --inputs "$SAVE_DIR" --num-epoch-checkpoints "$LAST" --output "$OUTPUT"
fi
