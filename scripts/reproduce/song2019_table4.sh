#!/usr/bin/env bash
# Song et al. (2019), Table 4: Transformer (big) and HySAN (big; e1, gated sum) on the
# WMT17 Zh-En test set. The other systems of the table (SogouNMT, XMUNMT, Uedin-NMT)
# are not reproduced; the paper's Transformer row (24.20) is Hassan et al.'s (2018)
# number. Settings: configs/papers/song2019_wmt17_zh_en_big.sh; docs/reproduce.md.
#
# Usage: song2019_table4.sh [--dry-run] [--work-dir DIR] [--raw-dir DIR] [--gpus N]
#                           [--only "ROW ..."] [--cpu] [--table] [--list] [options]
set -euo pipefail

TABLE_TITLE="Song et al. (2019), Table 4: WMT17 Zh-En test set"
TABLE_SIGNIFICANCE=none
# name|config|extra args|paper BLEU|baseline row|paper params|paper speed
TABLE_ROWS=(
    "zh-en.big.transformer|song2019_wmt17_zh_en_big|--arch transformer_vaswani_wmt_en_de_big|24.20|||"
    "zh-en.big.hysan_gated|song2019_wmt17_zh_en_big|--hysan-fusion gated|25.27|zh-en.big.transformer||"
)

. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
reproduce_main "$@"
