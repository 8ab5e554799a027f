#!/usr/bin/env bash
# Average the last N checkpoints of a training run (fairseq-localness-average).
#
# Usage: average.sh --save-dir DIR --last N [--by update|epoch] [--output FILE]
#
# The average is written to a temporary file and renamed; an existing output is
# replaced only by a complete new file, and an input is never overwritten.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parse_options "$@" <<'EOF'
--save-dir DIR     SAVE_DIR  dir                  required
    the training run's checkpoint directory
--last N           LAST      int:1                required
    how many checkpoints to average. The papers (after Vaswani et al.
    2017): --last 5 for Transformer-base models, --last 20 for big
    ones, of checkpoints saved at regular intervals (--by update with
    fairseq-train --save-interval-updates, e.g. every 1000 updates)
--by update|epoch  BY        choice:update|epoch  epoch
    update: average checkpoint_<epoch>_<update>.pt files (written with
    fairseq-train --save-interval-updates); epoch (the default):
    average checkpoint<epoch>.pt files
--output FILE      OUTPUT    text                 -
    default: DIR/checkpoint_avg_last<N>.pt
EOF

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
