# Yang et al. (2018): WMT17 Zh-En, Transformer-Big (Table 4): the big En-De recipe
# (yang2018_wmt14_big.sh, read first) on the Zh-En data. Labels: [paper], [*]
# (docs/reproduce.md).
. "$(dirname "${BASH_SOURCE[0]}")/yang2018_wmt14_big.sh"
# [*] the setting's name in our tables.
DESCRIPTION="Yang et al. 2018, WMT17 Zh-En, Transformer-Big"

# [paper] the Zh-En data, as in yang2018_wmt17_zh_en_base.sh (quotes there).
# [*] the BLEU, the separate subword models and embeddings as there (reasons there).
PAIRS=("wmt17_zh_en|zh|en|32000|nist")
BPE_JOINT=no
MODEL_ARGS=(--share-decoder-input-output-embed)
