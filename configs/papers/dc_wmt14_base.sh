# "Dual contextual module for neural machine translation" (Ampomah, McClean and
# Hawe 2021): WMT14 En-De, base (Table 1). Sourced by bash (scripts/reproduce/
# common.sh); the variables are described in docs/reproduce.md. What the paper's
# settings share is in base/dc.sh (read first). Labels: [paper], [*] (docs/reproduce.md).
. "$(dirname "${BASH_SOURCE[0]}")/base/dc.sh"
# [*] the setting's name in our tables.
DESCRIPTION="Dual Contextual module, WMT14 En-De, base"

# [paper] "The dataset for the En→De translation task consists of about 4.5M sentence
# pairs ... the newstest2013 and newstest2014 sets are employed as the validation and
# test sets"; the 32k vocabulary (base/dc.sh); "the 4-gram case-sensitive NIST BLEU
# metric is employed as the evaluation metric for the En→De task". [*] mteval-v13a -c
# is reproduced by sacreBLEU's default 13a tokenization on the detokenized output (the
# main column); compound splitting is not mentioned, but Table 1 compares with Vaswani
# et al.'s 27.3, which uses it: tokenized BLEU with compound splitting is an extra column.
#   dataset|src|tgt|bpe size|bleu kind[+extra kind]
PAIRS=("wmt14_en_de|en|de|32000|nist+tok-compound")
# [paper] the paper's words on its metric, quoted in the table's notes.
PAPER_BLEU="the 4-gram case-sensitive NIST BLEU metric is employed as the evaluation metric for the En->De task"

# [paper] "for En→De, the hidden size, number of attention heads and number of layers
# are 512, 8 and, 6, respectively". [*] FFN 2048: Transformer-base.
ARCH=dc_transformer_wmt_en_de

# [paper] the recipe of base/dc.sh, with one cosine period of 160000 - 4000 updates.
# [*] not stated: the peak learning rate (Vaswani et al.'s base peak 7e-4), dropout
# (Transformer-base's 0.1), weight decay (none).
dc_recipe 7e-4 156000 0.1 0.0 4960
# [paper] "The batch size and the number of iterations employed to train the model on
# the En→De are 4960 tokens and 160k iterations, respectively." [*] The number of GPUs
# is not given: 4960 is taken as the whole batch.
MAX_UPDATE=160000
EFFECTIVE_TOKENS=4960
# [paper] "For the En→De task, a beam-size of 4 and a length penalty of 0.6 is employed."
BEAM=4
LENPEN=0.6
