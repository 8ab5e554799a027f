#!/usr/bin/env bash
# Song et al. (2019), Table 3: Transformer and HySAN (e1, gated sum), base and big, on
# the WMT14 En-De test set. The other systems of the table (ByteNet, GNMT, ConvS2S,
# MoE) are not reproduced; the paper's Transformer rows are Vaswani et al.'s numbers.
# These rows are Table 2's (same names and settings: song2019_table2.sh with the same
# --work-dir reuses them). Settings: configs/papers/song2019_wmt14_{base,big}.sh;
# docs/reproduce.md.
#
# Usage: song2019_table3.sh [--dry-run] [--work-dir DIR] [--raw-dir DIR] [--gpus N]
#                           [--only "ROW ..."] [--cpu] [--table] [--list] [options]
set -euo pipefail

TABLE_TITLE="Song et al. (2019), Table 3: WMT14 En-De test set"
TABLE_SIGNIFICANCE=none
# name|config|extra args|paper BLEU|baseline row|paper params|paper speed
TABLE_ROWS=(
    "base.transformer|song2019_wmt14_base|--arch transformer_wmt_en_de|27.3|||"
    "base.hysan_gated|song2019_wmt14_base|--hysan-fusion gated|27.9|base.transformer||"
    "big.transformer|song2019_wmt14_big|--arch transformer_vaswani_wmt_en_de_big|28.4|||"
    "big.hysan_gated|song2019_wmt14_big|--hysan-fusion gated|28.8|big.transformer||"
)

. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
reproduce_main "$@"
