# Xu et al. (2019): WAT17 Ja-En, Transformer-Base (Table 2). As the En-De setting
# (xu2019_wmt14_base.sh, read first) except for the data. Labels: [paper], [*]
# (docs/reproduce.md).
. "$(dirname "${BASH_SOURCE[0]}")/xu2019_wmt14_base.sh"
# [*] the setting's name in our tables.
DESCRIPTION="Xu et al. 2019, WAT17 Ja-En, Transformer-Base"

# [paper] "For the WAT17 benchmark, we follow (Morishita et al., 2017) to use the first two
# sections of WAT17 dataset as the training data, which contains 2M sentences. The
# Japanese sentences are segmented by the word segmentation toolkit KeTea ... bytepair
# encoding ... with 32K merge operations." (Selection and segmentation belong to
# prepare_data.sh's wat17_ja_en recipe; [*] it segments with MeCab (fugashi, UniDic-lite),
# which installs from PyPI, in place of KyTea.) [*] Japanese and English share few subwords: 32K
# merges learned on each side and a dictionary per language (BPE_JOINT=no; the paper
# does not say whether its BPE was joint). BLEU: "4-gram case-sensitive NIST BLEU" as
# for En-De (mteval-v13a -c = sacreBLEU 13a on the detokenized English).
PAIRS=("wat17_ja_en|ja|en|32000|nist")
BPE_JOINT=no

# [*] Separate vocabularies: the source keeps its own embedding; the decoder's input and
# output embeddings are tied.
MODEL_ARGS=(--share-decoder-input-output-embed)
