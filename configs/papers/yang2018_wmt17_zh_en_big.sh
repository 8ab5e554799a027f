# Yang et al. (2018): WMT17 Zh-En, Transformer-Big (Table 4): the big En-De recipe
# (yang2018_wmt14_big.sh) on the Zh-En data (yang2018_wmt17_zh_en_base.sh).
. "$(dirname "${BASH_SOURCE[0]}")/yang2018_wmt14_big.sh"
DESCRIPTION="Yang et al. 2018, WMT17 Zh-En, Transformer-Big"

# Data and embeddings as in yang2018_wmt17_zh_en_base.sh (quotes there).
PAIRS=("wmt17_zh_en|zh|en|32000|nist")
BPE_JOINT=no
MODEL_ARGS=(--share-decoder-input-output-embed)
