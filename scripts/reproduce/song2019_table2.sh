#!/usr/bin/env bash
# Song et al. (2019), "Hybrid Self-Attention Network for Machine Translation", Table 2:
# the fusion methods (sum, concat, gated sum) of HySAN's "e1" branches on (a) IWSLT14
# De-En (small: 2 layers, d=256), (b) WMT14 En-De base and (c) WMT14 En-De big, with
# the parameters each adds. The paper reports no significance test. Settings:
# configs/papers/song2019_*.sh; docs/reproduce.md. The base and big rows named
# *.transformer and *.hysan_gated are Table 3's (same names and settings).
#
# Usage: song2019_table2.sh [--dry-run] [--work-dir DIR] [--raw-dir DIR] [--gpus N]
#                           [--only "ROW ..."] [--cpu] [--table] [--list] [options]
set -euo pipefail

TABLE_TITLE="Song et al. (2019), Table 2: fusion methods on IWSLT14 De-En (small), WMT14 En-De (base, big)"
TABLE_SIGNIFICANCE=none
# name|config|extra args|paper BLEU|baseline row|paper params|paper speed
# (the paper prints '-' for sum: no extra parameters, written +0 here)
TABLE_ROWS=(
    "iwslt.transformer|song2019_iwslt14_small|--hysan-encoder-layers none --hysan-decoder-layers none|31.27||11.9M|"
    "iwslt.hysan_sum|song2019_iwslt14_small|--hysan-fusion sum|32.07|iwslt.transformer|+0|"
    "iwslt.hysan_concat|song2019_iwslt14_small|--hysan-fusion concat|32.13|iwslt.transformer|+524K|"
    "iwslt.hysan_gated|song2019_iwslt14_small|--hysan-fusion gated|32.28|iwslt.transformer|+32K|"
    "base.transformer|song2019_wmt14_base|--arch transformer_wmt_en_de|27.3||66.8M|"
    "base.hysan_sum|song2019_wmt14_base|--hysan-fusion sum|27.4|base.transformer|+0|"
    "base.hysan_concat|song2019_wmt14_base|--hysan-fusion concat|27.7|base.transformer|+6.29M|"
    "base.hysan_gated|song2019_wmt14_base|--hysan-fusion gated|27.9|base.transformer|+383K|"
    "big.transformer|song2019_wmt14_big|--arch transformer_vaswani_wmt_en_de_big|28.4||213.4M|"
    "big.hysan_sum|song2019_wmt14_big|--hysan-fusion sum|28.2|big.transformer|+0|"
    "big.hysan_concat|song2019_wmt14_big|--hysan-fusion concat|28.7|big.transformer|+25.1M|"
    "big.hysan_gated|song2019_wmt14_big|--hysan-fusion gated|28.8|big.transformer|+1.57M|"
)

. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
reproduce_main "$@"
