# "Dual contextual module for neural machine translation" (Ampomah, McClean and Hawe
# 2021): what its settings share (sourced first by dc_wmt14_base.sh and dc_iwslt.sh;
# not a configuration itself). Quotes are from the paper's section 5. Labels:
# [paper], [*] (docs/reproduce.md).
. "$(dirname "${BASH_SOURCE[0]}")/recipes.sh"

# [paper] "a shared vocabulary via byte-pair-encoding (subword-nmt)" (footnote 4: the
# subword-nmt repository); "The vocabularies for the En→De, Es↔En, En↔Vi, Ro↔En and
# Fr↔En translation tasks consist of 32k, 34k, 21k, 32k and 31k subword tokens". [*] a
# vocabulary size: we learn as many merges (PAIRS), which gives about that many.
BPE=subword-nmt
# [paper] one embedding matrix for the shared vocabulary ("a shared vocabulary ... for
# both the encoding and decoding subnetworks"; the paper's 61.2M baseline).
MODEL_ARGS=(--share-all-embeddings)
# [paper] "the filter size of the CNN unit of the Local Context Unit is set to 2".
# [*] Enc-DC by default; the rows choose the mode.
METHOD_ARGS=(--dc-mode enc --dc-kernel-size 2)
# [*] not stated: Vaswani et al.'s base recipe, the last 5 checkpoints.
AVERAGE_LAST=5
# [*] maximum output length not stated: input + 50 (Vaswani et al.).
GENERATE_ARGS=(--max-len-a 1 --max-len-b 50)
# dc_recipe LR PERIOD DROPOUT WEIGHT_DECAY MAX_TOKENS: TRAIN_ARGS of the paper's recipe.
# [paper] "Adam (Kingma and Ba 2014) (with β1 = 0.9, β2 = 0.98, ε = 10^9 [sic: 1e-9]) is
# used as the optimizer"; "the learning rate scheduling algorithm employed in this work
# is the single-cosine-cycle with warm-up (So et al. 2019)": fairseq's cosine scheduler,
# one period from the end of the warm-up to the last update, decaying to 0. [*] the
# warm-up (4000 updates) and label smoothing (0.1) are not stated: Vaswani et al.'s.
dc_recipe() { cosine_recipe "$@"; }
