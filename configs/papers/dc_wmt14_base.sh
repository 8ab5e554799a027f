# "Dual contextual module for neural machine translation" (Ampomah, McClean and
# Hawe 2021): WMT14 En-De, base (Table 1). Sourced by bash (scripts/reproduce/
# common.sh); the variables are described in docs/reproduce.md. Quotes are from the
# paper's section 5; where it is silent we follow fairseq's standard recipe and say so.
DESCRIPTION="Dual Contextual module, WMT14 En-De, base"

# Data: "The dataset for the En->De translation task consists of about 4.5M sentence
# pairs ... the newstest2013 and newstest2014 sets are employed as the validation and
# test sets"; "a shared vocabulary via byte-pair-encoding (subword-nmt)"; "The
# vocabularies for the En->De ... consist of 32k ... subword tokens" (a vocabulary
# size; we learn 32000 merges, which gives about that many). BLEU: "the 4-gram
# case-sensitive NIST BLEU metric is employed as the evaluation metric for the En->De
# task": mteval-v13a -c, which sacreBLEU's default 13a tokenization on the detokenized
# output reproduces (the main column); compound splitting is not mentioned, but Table 1
# compares with Vaswani et al.'s 27.3, which uses it: tokenized BLEU with compound
# splitting is an extra column.
#   dataset|src|tgt|bpe size|bleu kind[+extra kind]
PAIRS=("wmt14_en_de|en|de|32000|nist+tok-compound")
PAPER_BLEU="the 4-gram case-sensitive NIST BLEU metric is employed as the evaluation metric for the En->De task"
BPE=subword-nmt

# Model: "for En->De, the hidden size, number of attention heads and number of layers
# are 512, 8 and, 6, respectively" (FFN 2048: Transformer-base); one embedding matrix
# for the shared vocabulary (the paper's 61.2M baseline). "the filter size of the CNN
# unit of the Local Context Unit is set to 2"; Enc-DC (every encoder layer) by default,
# the rows choose the mode.
ARCH=dc_transformer_wmt_en_de
MODEL_ARGS=(--share-all-embeddings)
METHOD_ARGS=(--dc-mode enc --dc-kernel-size 2)

# Recipe: "Adam (with beta1 = 0.9, beta2 = 0.98, eps = 10^9 [sic: 1e-9]) is used as the
# optimizer"; "the learning rate scheduling algorithm employed in this work is the
# single-cosine-cycle with warm-up (So et al. 2019)": fairseq's cosine scheduler, one
# period from the end of the warm-up to the last update (--lr-period-updates = 160000
# - 4000, --t-mult 1), decaying to 0. Not stated: the peak learning rate and warm-up
# (Vaswani et al.'s base peak 7e-4 after 4000 steps), dropout and label smoothing
# (Transformer-base's 0.1 and 0.1), weight decay (none).
TRAIN_ARGS=(
    --optimizer adam --adam-betas '(0.9,0.98)' --adam-eps 1e-9
    --lr 7e-4 --lr-scheduler cosine --warmup-updates 4000 --warmup-init-lr 1e-7
    --lr-period-updates 156000 --t-mult 1 --min-lr 0
    --dropout 0.1 --weight-decay 0.0
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1
    --max-tokens 4960
    --save-interval-updates 1000 --keep-interval-updates 5 --no-epoch-checkpoints
)
# "The batch size and the number of iterations employed to train the model on the
# En->De are 4960 tokens and 160k iterations, respectively." (The number of GPUs is not
# given; 4960 is taken as the whole batch.)
MAX_UPDATE=160000
EFFECTIVE_TOKENS=4960
# Not stated; Vaswani et al.: the last 5 checkpoints of a base model.
AVERAGE_LAST=5
# "For the En->De task, a beam-size of 4 and a length penalty of 0.6 is employed."
# Maximum output length not stated: input + 50 (Vaswani et al.).
BEAM=4
LENPEN=0.6
GENERATE_ARGS=(--max-len-a 1 --max-len-b 50)
