#!/usr/bin/env bash
# Xu et al. (2019), Table 2: TRANSFORMER, + LOCAL_PATTERN and + HYBRID (Gate) on the
# WMT14 En-De and WAT17 Ja-En test sets (Transformer-Base), with the significance of
# HYBRID (Gate) over the Transformer (the paper marks it on both tasks, "tested by
# bootstrap resampling (Koehn, 2004)": paired bootstrap with full-size resamples).
# The En-De rows are those of Table 1 (xu2019_table1.sh, same names and settings: one
# --work-dir for both trains them once). Settings:
# configs/papers/xu2019_wmt14_base.sh, xu2019_wat17_ja_en_base.sh; docs/reproduce.md.
#
# Usage: xu2019_table2.sh [--dry-run] [--work-dir DIR] [--raw-dir DIR] [--gpus N]
#                         [--only "ROW ..."] [--cpu] [--table] [--list] [options]
set -euo pipefail

TABLE_TITLE="Xu et al. (2019), Table 2: WMT14 En-De and WAT17 Ja-En test sets"
TABLE_SIGNIFICANCE=paired-bs
# name|config|extra args|paper BLEU|baseline row|paper params|paper speed
# (the paper tests HYBRID (Gate) only; LOCAL_PATTERN has no baseline here)
TABLE_ROWS=(
    "en-de.transformer|xu2019_wmt14_base|--arch transformer_wmt_en_de|27.67|||"
    "en-de.local_pattern|xu2019_wmt14_base|--hybrid-variant local_pattern|28.13|||"
    "en-de.hybrid_gate|xu2019_wmt14_base|--hybrid-variant gate|28.31|en-de.transformer||"
    "ja-en.transformer|xu2019_wat17_ja_en_base|--arch transformer_wmt_en_de|28.10|||"
    "ja-en.local_pattern|xu2019_wat17_ja_en_base|--hybrid-variant local_pattern|28.23|||"
    "ja-en.hybrid_gate|xu2019_wat17_ja_en_base|--hybrid-variant gate|28.66|ja-en.transformer||"
)

. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
reproduce_main "$@"
