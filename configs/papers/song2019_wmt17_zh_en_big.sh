# Song et al. (2019): WMT17 Zh-En, big (Table 4). The big En-De recipe
# (song2019_wmt14_big.sh, read first) on the Zh-En data. Labels: [paper], [*]
# (docs/reproduce.md).
. "$(dirname "${BASH_SOURCE[0]}")/song2019_wmt14_big.sh"
# [*] the setting's name in our tables.
DESCRIPTION="Song et al. 2019, WMT17 Zh-En, big"

# [paper] "WMT17 Chinese-English translation task contains 24M bilingual data ... We use
# the same data selection as introduced in Hassan (2018). We keep 18M sentences after
# preprocessing. Newsdev2017 is used as the development set and newstest2017 is as the
# test set." "For WMT17 Chinese-English, we only use a big model setting." (Selection
# and word segmentation belong to prepare_data.sh's wmt17_zh_en recipe.) [*] The
# vocabulary is not described: 32000 sentencepiece pieces per language (Chinese and
# English share few; BPE_JOINT=no). BLEU: no tool named; sacreBLEU, as Hassan et al.'s
# 24.2, which Table 4 lists.
PAIRS=("wmt17_zh_en|zh|en|32000|sacrebleu")
BPE_JOINT=no

# [*] not stated whether the vocabulary is shared for Zh-En: the source keeps its own
# embedding; the decoder's input and output embeddings are tied.
MODEL_ARGS=(--share-decoder-input-output-embed)
