# Song et al. (2019), "Hybrid Self-Attention Network for Machine Translation": what its
# settings share (sourced first by song2019_iwslt14_small.sh and song2019_wmt14_base.sh;
# not a configuration itself). Quotes are from the paper's "Experiment setting" and
# "Results" sections. Labels: [paper], [*] (docs/reproduce.md).
. "$(dirname "${BASH_SOURCE[0]}")/recipes.sh"

# [paper] the paper's only words on its metric, quoted in the table's notes.
PAPER_BLEU="We report our results by BLEU (Papineni et al. 2002) scores"
# [paper] "a 32000 word-piece (Wu et al. 2016) shared vocabulary": sentencepiece,
# 32000 pieces, one model for both languages.
BPE=sentencepiece
# [*] one embedding matrix for the shared vocabulary (with it the baselines have
# Table 2's 11.9M and 66.8M parameters).
MODEL_ARGS=(--share-all-embeddings)
# [paper] "our next experiments mainly adopt e1 as the default setting" (encoder
# global, forward, backward, local1; decoder forward, local1; every layer:
# docs/hysan_transformer.md) and "Gated sum is our preferred method"; the Table 2
# rows change the fusion. [*] the squeeze gate's r = 16 is not stated (the reading of
# Table 2's parameter counts in docs/hysan_transformer.md).
METHOD_ARGS=(
    --hysan-encoder-branches global,forward,backward,local1 --hysan-decoder-branches forward,local1
    --hysan-encoder-layers all --hysan-decoder-layers all --hysan-fusion gated --hysan-gate-reduction 16
)
# [paper] "We report the results by averaging the last 5 and 20 checkpoints for the
# base and big model respectively" (the big setting sets 20). [*] the small model is not
# mentioned: 5, as for base.
AVERAGE_LAST=5
# [paper] "During the decoding step, we set beam size as 4 and length penalty α = 0.6.
# The maximum decoding length is set as the input length plus 50." (fairseq's --lenpen
# divides by length^0.6, not tensor2tensor's ((5+len)/6)^0.6.)
BEAM=4
LENPEN=0.6
GENERATE_ARGS=(--max-len-a 1 --max-len-b 50)
# song2019_recipe LR DROPOUT WEIGHT_DECAY KEEP: TRAIN_ARGS of the paper's recipe.
# [paper] "Adam ... with β1 = 0.9, β2 = 0.98 and ε = 10−9"; "lr = d_model^-0.5 ·
# min(steps^-0.5, steps · warm_steps^-1.5)" (eq. 15): inverse_sqrt with peak
# d^-0.5 * warm_steps^-0.5. [*] warm_steps is not given: Vaswani et al.'s 4000; label
# smoothing is not given: Vaswani et al.'s 0.1; checkpoints every 1000 updates.
song2019_recipe() { vaswani_recipe "$@"; }
