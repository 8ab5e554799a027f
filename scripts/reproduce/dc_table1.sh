#!/usr/bin/env bash
# "Dual contextual module for neural machine translation", Table 1: the Transformer
# and the DC module in the encoder (Enc-DC), the decoder (Dec-DC) or both (Full-DC) on
# the WMT14 En-De test set, with parameters, training speed (steps/s) and the
# significance of each DC model over the Transformer (paired bootstrap, compare-mt,
# 1000 samples: the paper's test). The rows of other systems are not reproduced.
# Settings: configs/papers/dc_wmt14_base.sh; docs/reproduce.md.
#
# Usage: dc_table1.sh [--dry-run] [--work-dir DIR] [--raw-dir DIR] [--gpus N]
#                     [--only "ROW ..."] [--cpu] [--table] [--list] [options]
set -euo pipefail

TABLE_TITLE="Dual Contextual module, Table 1: WMT14 En-De test set"
TABLE_SIGNIFICANCE=compare-mt
# name|config|extra args|paper BLEU|baseline row|paper params|paper speed
TABLE_ROWS=(
    "transformer|dc_wmt14_base|--arch transformer_wmt_en_de|28.37||61.2M|3.66"
    "enc-dc|dc_wmt14_base|--dc-mode enc|29.26|transformer|73.86M|3.0"
    "dec-dc|dc_wmt14_base|--dc-mode dec|28.86|transformer|73.86M|3.08"
    "full-dc|dc_wmt14_base|--dc-mode full|29.11|transformer|86.5M|2.53"
)

. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
reproduce_main "$@"
