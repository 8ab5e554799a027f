# Song et al. (2019), "Hybrid Self-Attention Network for Machine Translation": WMT14
# En-De, base (Tables 2b and 3). Sourced by bash (scripts/reproduce/common.sh); the
# variables are described in docs/reproduce.md. Quotes are from the paper's
# "Experiment setting" section; where it is silent we follow Vaswani et al. (2017),
# which its recipe follows, or fairseq's standard recipe, and say so.
DESCRIPTION="Song et al. 2019, WMT14 En-De, base"

# Data: "WMT14 English-German dataset ... comprises about 4.5 million sentence pairs
# ... We adopt newtest2013 as the validate set and newtest2014 as the test set. The
# tokens are split with a 32000 word-piece shared vocabulary" (sentencepiece, 32000).
# BLEU: the paper says only "BLEU (Papineni et al. 2002)": sacreBLEU (with its
# signature) as the main column; its Table 3 compares with Vaswani et al.'s 27.3
# (tokenized, compound split), so that kind is an extra column.
#   dataset|src|tgt|bpe size|bleu kind[+extra kind]
PAIRS=("wmt14_en_de|en|de|32000|sacrebleu+tok-compound")
PAPER_BLEU="We report our results by BLEU (Papineni et al. 2002) scores"
BPE=sentencepiece

# Model: "we adopt 6 identical hidden layers with 512 dimensions for the base model";
# "The number of the attention head of small, base and big model settings are set as
# 4, 8 and 16". Shared vocabulary: one embedding matrix (Table 2b's 66.8M baseline).
ARCH=hysan_transformer_wmt_en_de
MODEL_ARGS=(--share-all-embeddings)
# "our next experiments mainly adopt e1 as the default setting" (encoder global,
# forward, backward, local1; decoder forward, local1; every layer, docs/hysan_transformer.md) with
# "Gated sum ... our preferred method"; the squeeze gate's r = 16 is not stated
# (the reading of Table 2's parameter counts in docs/hysan_transformer.md). Table 2 rows change the fusion.
METHOD_ARGS=(
    --hysan-encoder-branches global,forward,backward,local1 --hysan-decoder-branches forward,local1
    --hysan-encoder-layers all --hysan-decoder-layers all --hysan-fusion gated --hysan-gate-reduction 16
)

# Recipe: "Adam ... with beta1 = 0.9, beta2 = 0.98 and eps = 1e-9"; "lr = d^-0.5 *
# min(steps^-0.5, steps * warm_steps^-1.5)" (eq. 15): inverse_sqrt with peak
# 512^-0.5 * warm^-0.5; warm_steps is not given: Vaswani et al.'s 4000 (peak 7e-4).
# Dropout and label smoothing are not given: Vaswani et al.'s base, 0.1 and 0.1.
# Checkpoints every 1000 updates, the last AVERAGE_LAST kept.
TRAIN_ARGS=(
    --optimizer adam --adam-betas '(0.9,0.98)' --adam-eps 1e-9
    --lr 7e-4 --lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-7
    --dropout 0.1 --weight-decay 0.0
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1
    --max-tokens 4096
    --save-interval-updates 1000 --keep-interval-updates 5 --no-epoch-checkpoints
)
# "We use 8 NVIDIA P100 GPUs for WMT translation task, 100K steps for the base model
# and 300K steps for big model respectively."
MAX_UPDATE=100000
# "The batch size is set as 4096" (per GPU, tensor2tensor's convention) on 8 GPUs.
EFFECTIVE_TOKENS=32768
# "We report the results by averaging the last 5 and 20 checkpoints for the base and
# big model respectively".
AVERAGE_LAST=5
# "During the decoding step, we set beam size as 4 and length penalty alpha = 0.6. The
# maximum decoding length is set as the input length plus 50." (fairseq's --lenpen
# divides by length^0.6, not tensor2tensor's ((5+len)/6)^0.6.)
BEAM=4
LENPEN=0.6
GENERATE_ARGS=(--max-len-a 1 --max-len-b 50)
