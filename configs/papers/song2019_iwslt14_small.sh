# Song et al. (2019): IWSLT14 De-En, small (Tables 1 and 2a). Sourced by bash
# (scripts/reproduce/common.sh); the variables are described in docs/reproduce.md.
# Quotes are from the paper's "Experiment setting" section.
DESCRIPTION="Song et al. 2019, IWSLT14 De-En, small"

# Data: "we tokenize the data which comes from TED and TEDx talks, and remains 160K
# training sentences and 7K development sentences. We concatenate dev2010, tst2010,
# tst2011 and tst2012 as the test set. We preprocess corpus with a 32000 word-piece
# shared vocabulary". The iwslt14_de_en dataset's default variant, "paper", is this
# test set with case kept (the paper does not mention lowercasing); --variant fairseq
# gives fairseq's prepare-iwslt14.sh split (TEDX.dev2012 added, lowercased) instead.
# Train and valid: fairseq's recipe (the same 160K / 7K). BLEU: the paper says only
# "BLEU (Papineni et al. 2002)": sacreBLEU (with its signature) as the main column,
# tokenized multi-bleu style BLEU, the usual report on this task, as an extra one.
#   dataset|src|tgt|bpe size|bleu kind[+extra kind]
PAIRS=("iwslt14_de_en|de|en|32000|sacrebleu+multi-bleu")
PAPER_BLEU="We report our results by BLEU (Papineni et al. 2002) scores"
BPE=sentencepiece

# Model: "the model is set as 2 hidden layers with 256 dimensions"; 4 heads ("small");
# FFN 1024 is not stated (tensor2tensor's transformer_small; with the shared 32K
# vocabulary the baseline has Table 2a's 11.9M parameters).
ARCH=hysan_transformer_iwslt_small
MODEL_ARGS=(--share-all-embeddings)
# "our next experiments mainly adopt e1 as the default setting" and "Gated sum is our
# preferred method" (the branches: docs/hysan_transformer.md; r = 16 is not stated).
METHOD_ARGS=(
    --hysan-encoder-branches global,forward,backward,local1 --hysan-decoder-branches forward,local1
    --hysan-encoder-layers all --hysan-decoder-layers all --hysan-fusion gated --hysan-gate-reduction 16
)

# Recipe: "Adam ... beta1 = 0.9, beta2 = 0.98 and eps = 1e-9"; eq. 15 at d = 256 with
# Vaswani et al.'s 4000 warm-up steps (not stated): peak 256^-0.5 * 4000^-0.5 = 1e-3.
# Dropout, label smoothing and weight decay are not given: fairseq's IWSLT14 recipe
# (dropout 0.3, label smoothing 0.1, weight decay 1e-4).
TRAIN_ARGS=(
    --optimizer adam --adam-betas '(0.9,0.98)' --adam-eps 1e-9
    --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-7
    --dropout 0.3 --weight-decay 0.0001
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1
    --max-tokens 4096
    --save-interval-updates 1000 --keep-interval-updates 5 --no-epoch-checkpoints
)
# "this task is deployed on single NVIDIA Titan X Pascal GPU for 100K steps."
MAX_UPDATE=100000
# "The batch size is set as 4096", on one GPU.
EFFECTIVE_TOKENS=4096
# "averaging the last 5 and 20 checkpoints for the base and big model": the small
# model is not mentioned; 5 as for base.
AVERAGE_LAST=5
# "beam size as 4 and length penalty alpha = 0.6 ... input length plus 50."
BEAM=4
LENPEN=0.6
GENERATE_ARGS=(--max-len-a 1 --max-len-b 50)
