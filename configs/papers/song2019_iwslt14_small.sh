# Song et al. (2019): IWSLT14 De-En, small (Tables 1 and 2a). Sourced by bash
# (scripts/reproduce/common.sh); the variables are described in docs/reproduce.md.
# What the paper's settings share is in base/song2019.sh (read first). Labels:
# [paper], [*] (docs/reproduce.md).
. "$(dirname "${BASH_SOURCE[0]}")/base/song2019.sh"
# [*] the setting's name in our tables.
DESCRIPTION="Song et al. 2019, IWSLT14 De-En, small"

# [paper] "we tokenize the data which comes from TED and TEDx talks, and remains 160K
# training sentences and 7K development sentences. We concatenate dev2010, tst2010,
# tst2011 and tst2012 as the test set. We preprocess corpus with a 32000 word-piece
# (Wu et al. 2016) shared vocabulary". [*] The iwslt14_de_en dataset's default variant,
# "paper", is this test set with case kept (the paper does not mention lowercasing);
# --variant fairseq gives fairseq's prepare-iwslt14.sh split (TEDX.dev2012 added,
# lowercased) instead. Train and valid: fairseq's recipe (the same 160K / 7K). The
# paper names no BLEU tool: sacreBLEU (with its signature) as the main column,
# tokenized multi-bleu style BLEU, the usual report on this task, as an extra one.
#   dataset|src|tgt|bpe size|bleu kind[+extra kind]
PAIRS=("iwslt14_de_en|de|en|32000|sacrebleu+multi-bleu")

# [paper] "the model is set as 2 hidden layers with 256 dimensions"; "The number of the
# attention head of small, base and big model settings are set as 4, 8 and 16". [*] FFN
# 1024 is not stated (tensor2tensor's transformer_small).
ARCH=hysan_transformer_iwslt_small

# [paper] eq. 15 at d = 256. [*] with 4000 warm-up steps (not stated): peak
# 256^-0.5 * 4000^-0.5 = 1e-3; dropout and weight decay are not given: fairseq's
# IWSLT14 recipe (dropout 0.3, weight decay 1e-4).
song2019_recipe 1e-3 0.3 0.0001 5
# [paper] "this task is deployed on single NVIDIA Titan X Pascal GPU for 100K steps."
MAX_UPDATE=100000
# [paper] "The batch size is set as 4096". [*] The sentence follows the WMT setting;
# read as this task's batch too, on its one GPU.
EFFECTIVE_TOKENS=4096
