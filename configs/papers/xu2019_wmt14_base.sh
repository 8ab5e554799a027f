# Xu et al. (2019), "Leveraging Local and Global Patterns for Self-Attention
# Networks": WMT14 En-De, Transformer-Base (Tables 1 and 2). Sourced by bash
# (scripts/reproduce/common.sh); the variables are described in docs/reproduce.md.
# Quotes are from the paper (section 4 and appendix A.1). Labels: [paper] the paper's
# value, in its words; [*] this project's choice where the paper is silent, with the
# reason (Vaswani et al. (2017), whose configuration it uses, or fairseq's standard
# recipe). The paper trains base models only (no big setting).
# [*] the setting's name in our tables.
DESCRIPTION="Xu et al. 2019, WMT14 En-De, Transformer-Base"

# [paper] "WMT 14 English-to-German ... all the data are segmented into subword units
# using byte-pair encoding ... with 32K merge operations" (validation newstest2013 and
# test newstest2014, the splits of Yang et al. 2018 and Vaswani et al.). BLEU: "The
# 4-gram case-sensitive NIST BLEU score (Papineni et al., 2002) is used as the
# evaluation metric". [*] mteval-v13a -c, which sacreBLEU's default 13a tokenization on the
# detokenized output reproduces (the main column); tokenized BLEU with compound
# splitting, the convention of the Vaswani et al. numbers it reproduces, is an extra
# column (the paper does not mention it).
#   dataset|src|tgt|bpe size|bleu kind[+extra kind]
PAIRS=("wmt14_en_de|en|de|32000|nist+tok-compound")
# [paper] the paper's words on its metric, quoted in the table's notes.
PAPER_BLEU="The 4-gram case-sensitive NIST BLEU score (Papineni et al., 2002) is used as the evaluation metric"
# [paper] "bytepair encoding (Sennrich et al., 2016)": subword-nmt.
BPE=subword-nmt

# [paper] "We use the same configuration as Vaswani et al. (2017), in which the hidden
# size is 512, the number of encoder and decoder layer is 6, the number of head is 8"
# (A.1). [*] One shared embedding matrix (fairseq's recipe for joint BPE; the paper's
# 88.0M counts THUMT's separate source embedding: the table marks our smaller count
# "(shared emb.)").
ARCH=hybrid_transformer_wmt_en_de
MODEL_ARGS=(--share-all-embeddings)
PAPER_EMBEDDINGS=separate  # [paper] what the paper's parameter count has
# [paper] "we merely apply the locality model at the lowest two layers of the encoder.
# According to our empirical results (Section 5.2), we set the window size to 3 (i.e.
# m = 1)"; the gate of eq. 4-5 ("HYBRID (Gate)"). Rows of Table 1 change the variant.
METHOD_ARGS=(--hybrid-variant gate --hybrid-encoder-layers 1-2 --hybrid-window-m 1)

# [paper] (A.1) "label smoothing is 0.1"; "We use Adam with beta1 = 0.9, beta2 = 0.98
# and eps = 1e-9. The learning rate linearly warms up over the first 4,000 steps, and
# decreases thereafter proportionally to the inverse square root of the step number"
# ([*] peak: Vaswani et al.'s d^-0.5 * 4000^-0.5 = 7e-4); "We use a dropout rate of 0.1 on
# all layers" (residual, attention and FFN activations). "Different to Vaswani et al.
# (2017), we set the L2 regularization to lambda = 1e-7": an L2 term in the loss, which
# fairseq's Adam (decoupled weight decay) cannot express: this package's adam_l2 adds
# lambda * w to the gradients before the Adam step (fairseq_localness/optim.py).
# [*] At most 3125 tokens per GPU: the paper's 25000 on 1, 2, 4 or 8 GPUs without rounding.
TRAIN_ARGS=(
    --optimizer adam_l2 --l2-regularization 1e-7 --adam-betas '(0.9,0.98)' --adam-eps 1e-9
    --lr 7e-4 --lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-7
    --dropout 0.1 --attention-dropout 0.1 --activation-dropout 0.1 --weight-decay 0.0
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1
    --max-tokens 3125
    --save-interval-updates 1000 --keep-interval-updates 5 --no-epoch-checkpoints
)
# [paper] "The training of each model was early-stopped to maximize the BLEU score on the
# development set" (A.1): TRAINING=early-stop validates every 1000 updates with
# fairseq's --eval-bleu (beam and length penalty as below) and stops when development
# BLEU has not improved for PATIENCE validations ([*] not stated: 10), then translates with
# checkpoint_best.pt, no averaging. [*] MAX_UPDATE bounds the run: Vaswani et al.'s base
# model, 100K steps (the paper states no step count). --training fixed: 100K updates
# and the average of the last AVERAGE_LAST checkpoints instead (an alternative).
TRAINING=early-stop
PATIENCE=10
MAX_UPDATE=100000
# [paper] "All the models are trained with each batch containing approximately 25000 source
# tokens and 25000 target tokens" (A.1).
EFFECTIVE_TOKENS=25000
# [*] For --training fixed only (the paper early-stops): Vaswani et al.'s last 5 (base).
AVERAGE_LAST=5
# [*] Not stated; Vaswani et al.: beam 4, length penalty 0.6, output length input + 50.
BEAM=4
LENPEN=0.6
GENERATE_ARGS=(--max-len-a 1 --max-len-b 50)
