#!/usr/bin/env bash
# "Dual contextual module for neural machine translation", Table 2: the Transformer,
# Enc-DC, Dec-DC and Full-DC on the IWSLT tasks {Vi, Es, Fr, Ro} <-> En (4+4 layers,
# d=256, 4 heads). The paper tests significance on WMT14 only ("mainly due to the size
# of the test dataset"), so no test is run here. Settings: configs/papers/dc_iwslt.sh
# (one configuration, one entry of PAIRS per direction); docs/reproduce.md.
#
# Usage: dc_table2.sh [--dry-run] [--work-dir DIR] [--raw-dir DIR] [--gpus N]
#                     [--only "ROW ..."] [--cpu] [--table] [--list] [options]
set -euo pipefail

TABLE_TITLE="Dual Contextual module, Table 2: IWSLT {Vi,Es,Fr,Ro}<->En test sets"
TABLE_SIGNIFICANCE=none
# name|config|extra args|paper BLEU|baseline row|paper params|paper speed
TABLE_ROWS=(
    "vi-en.transformer|dc_iwslt:vi-en|--dc-mode none|29.03|||"
    "vi-en.enc-dc|dc_iwslt:vi-en|--dc-mode enc|29.42|vi-en.transformer||"
    "vi-en.dec-dc|dc_iwslt:vi-en|--dc-mode dec|29.20|vi-en.transformer||"
    "vi-en.full-dc|dc_iwslt:vi-en|--dc-mode full|29.70|vi-en.transformer||"
    "en-vi.transformer|dc_iwslt:en-vi|--dc-mode none|30.58|||"
    "en-vi.enc-dc|dc_iwslt:en-vi|--dc-mode enc|31.28|en-vi.transformer||"
    "en-vi.dec-dc|dc_iwslt:en-vi|--dc-mode dec|31.24|en-vi.transformer||"
    "en-vi.full-dc|dc_iwslt:en-vi|--dc-mode full|31.10|en-vi.transformer||"
    "es-en.transformer|dc_iwslt:es-en|--dc-mode none|39.80|||"
    "es-en.enc-dc|dc_iwslt:es-en|--dc-mode enc|40.18|es-en.transformer||"
    "es-en.dec-dc|dc_iwslt:es-en|--dc-mode dec|39.96|es-en.transformer||"
    "es-en.full-dc|dc_iwslt:es-en|--dc-mode full|40.15|es-en.transformer||"
    "en-es.transformer|dc_iwslt:en-es|--dc-mode none|37.90|||"
    "en-es.enc-dc|dc_iwslt:en-es|--dc-mode enc|38.59|en-es.transformer||"
    "en-es.dec-dc|dc_iwslt:en-es|--dc-mode dec|38.28|en-es.transformer||"
    "en-es.full-dc|dc_iwslt:en-es|--dc-mode full|38.10|en-es.transformer||"
    "fr-en.transformer|dc_iwslt:fr-en|--dc-mode none|32.85|||"
    "fr-en.enc-dc|dc_iwslt:fr-en|--dc-mode enc|33.35|fr-en.transformer||"
    "fr-en.dec-dc|dc_iwslt:fr-en|--dc-mode dec|33.15|fr-en.transformer||"
    "fr-en.full-dc|dc_iwslt:fr-en|--dc-mode full|33.42|fr-en.transformer||"
    "en-fr.transformer|dc_iwslt:en-fr|--dc-mode none|33.15|||"
    "en-fr.enc-dc|dc_iwslt:en-fr|--dc-mode enc|33.94|en-fr.transformer||"
    "en-fr.dec-dc|dc_iwslt:en-fr|--dc-mode dec|33.43|en-fr.transformer||"
    "en-fr.full-dc|dc_iwslt:en-fr|--dc-mode full|33.60|en-fr.transformer||"
    "ro-en.transformer|dc_iwslt:ro-en|--dc-mode none|26.66|||"
    "ro-en.enc-dc|dc_iwslt:ro-en|--dc-mode enc|27.15|ro-en.transformer||"
    "ro-en.dec-dc|dc_iwslt:ro-en|--dc-mode dec|26.81|ro-en.transformer||"
    "ro-en.full-dc|dc_iwslt:ro-en|--dc-mode full|27.14|ro-en.transformer||"
    "en-ro.transformer|dc_iwslt:en-ro|--dc-mode none|20.91|||"
    "en-ro.enc-dc|dc_iwslt:en-ro|--dc-mode enc|21.20|en-ro.transformer||"
    "en-ro.dec-dc|dc_iwslt:en-ro|--dc-mode dec|21.22|en-ro.transformer||"
    "en-ro.full-dc|dc_iwslt:en-ro|--dc-mode full|21.27|en-ro.transformer||"
)

. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
reproduce_main "$@"
