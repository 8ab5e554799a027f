#!/usr/bin/env bash
# Xu et al. (2019), "Leveraging Local and Global Patterns for Self-Attention
# Networks", Table 1: the re-implemented locality models and the hybrid attention on
# WMT14 En-De (Transformer-Base; locality in encoder layers 1-2, m = 1). All rows are
# hybrid_transformer variants (docs/hybrid_transformer.md); LOCAL_S uses Yang et al.'s
# three layers, which matches the paper's +0.8M. Settings:
# configs/papers/xu2019_wmt14_base.sh; docs/reproduce.md.
# The En-De rows of Table 2 are rows of this table (same names and settings):
# xu2019_table2.sh with the same --work-dir reuses these runs.
#
# Usage: xu2019_table1.sh [--dry-run] [--work-dir DIR] [--raw-dir DIR] [--gpus N]
#                         [--only "ROW ..."] [--cpu] [--table] [--list] [options]
set -euo pipefail

TABLE_TITLE="Xu et al. (2019), Table 1: WMT14 En-De test set"
TABLE_SIGNIFICANCE=none
# name|config|extra args|paper BLEU|baseline row|paper params|paper speed
TABLE_ROWS=(
    "en-de.transformer|xu2019_wmt14_base|--arch transformer_wmt_en_de|27.67||88.0M|"
    "en-de.neighbor|xu2019_wmt14_base|--hybrid-variant neighbor|27.90|en-de.transformer|+0.4M|"
    "en-de.local_h|xu2019_wmt14_base|--hybrid-variant local_h|28.03|en-de.transformer|+0.4M|"
    "en-de.local_s|xu2019_wmt14_base|--hybrid-variant local_s --hybrid-encoder-layers 1-3|28.11|en-de.transformer|+0.8M|"
    "en-de.local_pattern|xu2019_wmt14_base|--hybrid-variant local_pattern|28.13|en-de.transformer|+0.0M|"
    "en-de.hybrid_concat|xu2019_wmt14_base|--hybrid-variant concat|28.15|en-de.transformer|+0.3M|"
    "en-de.hybrid_gate|xu2019_wmt14_base|--hybrid-variant gate|28.31|en-de.transformer|+0.0M|"
)

. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
reproduce_main "$@"
