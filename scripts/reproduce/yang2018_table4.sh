#!/usr/bin/env bash
# Yang et al. (2018), "Modeling Localness for Self-Attention Networks", Table 4:
# Transformer-Base and -Big with localness (query-specific windows, encoder layers
# 1-3) and relative positions (Shaw et al. 2018), on WMT17 Zh-En and WMT14 En-De test
# sets; significance over the conventional self-attention counterpart ("tested by
# bootstrap resampling (Koehn, 2004)": paired bootstrap with full-size resamples).
# The rows of other systems (GNMT, ConvS2S, Vaswani et al., Hassan et al.) are not
# reproduced. Settings: configs/papers/yang2018_*.sh; docs/reproduce.md.
#
# Usage: yang2018_table4.sh [--dry-run] [--work-dir DIR] [--raw-dir DIR] [--gpus N]
#                           [--only "ROW ..."] [--cpu] [--table] [--list] [options]
set -euo pipefail

TABLE_TITLE="Yang et al. (2018), Table 4: WMT17 Zh-En and WMT14 En-De test sets"
TABLE_SIGNIFICANCE=paired-bs
# name|config|extra args|paper BLEU|baseline row|paper params|paper speed
TABLE_ROWS=(
    "zh-en.base|yang2018_wmt17_zh_en_base|--arch transformer_wmt_en_de|24.13||107.9M|"
    "zh-en.base+rel_pos|yang2018_wmt17_zh_en_base|--localness-encoder-layers none --localness-rel-pos|24.53|zh-en.base|108.0M|"
    "zh-en.base+localness|yang2018_wmt17_zh_en_base||24.77|zh-en.base|108.7M|"
    "zh-en.base+localness+rel_pos|yang2018_wmt17_zh_en_base|--localness-rel-pos|24.96|zh-en.base|108.8M|"
    "zh-en.big|yang2018_wmt17_zh_en_big|--arch transformer_vaswani_wmt_en_de_big|24.56||303.9M|"
    "zh-en.big+localness|yang2018_wmt17_zh_en_big||25.03|zh-en.big|307.2M|"
    "zh-en.big+localness+rel_pos|yang2018_wmt17_zh_en_big|--localness-rel-pos|25.28|zh-en.big|307.3M|"
    "en-de.base|yang2018_wmt14_base|--arch transformer_wmt_en_de|27.64||88.0M|"
    "en-de.base+rel_pos|yang2018_wmt14_base|--localness-encoder-layers none --localness-rel-pos|27.94|en-de.base|88.1M|"
    "en-de.base+localness|yang2018_wmt14_base||28.11|en-de.base|88.8M|"
    "en-de.base+localness+rel_pos|yang2018_wmt14_base|--localness-rel-pos|28.54|en-de.base|88.9M|"
    "en-de.big|yang2018_wmt14_big|--arch transformer_vaswani_wmt_en_de_big|28.58||264.1M|"
    "en-de.big+localness|yang2018_wmt14_big||28.89|en-de.big|267.4M|"
    "en-de.big+localness+rel_pos|yang2018_wmt14_big|--localness-rel-pos|29.18|en-de.big|267.5M|"
)

. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
reproduce_main "$@"
