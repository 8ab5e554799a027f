# Yang et al. (2018): WMT17 Zh-En, Transformer-Base (Table 4). As the En-De base
# setting (yang2018_wmt14_base.sh, read first) except for the data. Labels: [paper],
# [*] (docs/reproduce.md).
. "$(dirname "${BASH_SOURCE[0]}")/yang2018_wmt14_base.sh"
# [*] the setting's name in our tables.
DESCRIPTION="Yang et al. 2018, WMT17 Zh-En, Transformer-Base"

# [paper] "For the Zh-En task, the models were trained using all of the available
# parallel corpus from WMT17 dataset with maximum length limited to 50, consisting of
# about 20.62 million sentence pairs. We used newsdev2017 as the development set and
# newstest2017 as the test set. The Chinese sentences were segmented by the word
# segmentation toolkit Jieba ... byte-pair encoding (BPE) ... with 32K merge operations
# for both language pairs." (Segmentation and the length filter belong to
# prepare_data.sh's wmt17_zh_en recipe.) BLEU: 4-gram NIST BLEU as for En-De.
# [*] cased, as for En-De; no compound splitting for English.
PAIRS=("wmt17_zh_en|zh|en|32000|nist")
# [*] not stated whether the BPE was joint: Chinese and English share few subwords, so
# 32K merges are learned on each side, with a dictionary per language.
BPE_JOINT=no

# [*] separate vocabularies: the source keeps its own embedding, the decoder's input
# and output embeddings are tied (the paper's Zh-En model, 107.9M, is larger than its
# En-De one, 88.0M, by about one more embedding matrix).
MODEL_ARGS=(--share-decoder-input-output-embed)
