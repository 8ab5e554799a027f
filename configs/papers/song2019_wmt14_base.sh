# Song et al. (2019), "Hybrid Self-Attention Network for Machine Translation": WMT14
# En-De, base (Tables 2b and 3). Sourced by bash (scripts/reproduce/common.sh); the
# variables are described in docs/reproduce.md. What the paper's settings share is in
# base/song2019.sh (read first). Labels: [paper], [*] (docs/reproduce.md).
. "$(dirname "${BASH_SOURCE[0]}")/base/song2019.sh"
# [*] the setting's name in our tables.
DESCRIPTION="Song et al. 2019, WMT14 En-De, base"

# [paper] "WMT14 English-German dataset ... comprises about 4.5 million sentence pairs
# ... We adopt newtest2013 as the validate set and newtest2014 as the test set. The
# tokens are split with a 32000 word-piece shared vocabulary". [*] The paper names no
# BLEU tool: sacreBLEU (with its signature) as the main column; its Table 3 compares
# with Vaswani et al.'s 27.3 (tokenized, compound split), so that kind is an extra column.
#   dataset|src|tgt|bpe size|bleu kind[+extra kind]
PAIRS=("wmt14_en_de|en|de|32000|sacrebleu+tok-compound")

# [paper] "we adopt 6 identical hidden layers with 512 dimensions for the base model";
# "The number of the attention head of small, base and big model settings are set as
# 4, 8 and 16".
ARCH=hysan_transformer_wmt_en_de

# [paper] eq. 15 at d = 512. [*] with 4000 warm-up steps (not stated): peak 7e-4;
# dropout is not given: Vaswani et al.'s base, 0.1; no weight decay.
song2019_recipe 7e-4 0.1 0.0 5
# [paper] "We use 8 NVIDIA P100 GPUs for WMT translation task, 100K steps for the base
# model and 300K steps for big model respectively."
MAX_UPDATE=100000
# [paper] "The batch size is set as 4096", on 8 GPUs. [*] per GPU (tensor2tensor's
# convention for its batch_size): 8 x 4096.
EFFECTIVE_TOKENS=32768
