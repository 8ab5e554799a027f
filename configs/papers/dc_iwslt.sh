# "Dual contextual module for neural machine translation": the IWSLT tasks
# {Vi, Es, Fr, Ro} <-> En (Table 2). Sourced by bash (scripts/reproduce/common.sh);
# the variables are described in docs/reproduce.md. Quotes are from the paper's
# section 5; where it is silent we follow fairseq's standard recipe and say so.
DESCRIPTION="Dual Contextual module, IWSLT {Vi,Es,Fr,Ro}<->En, 4 layers, d=256"

# Data (section 5.1): "For the Es<->En and Ro<->En tasks, the datasets employed are
# respectively from the Spanish-to-English and Romanian-to-English translation tracks
# of the IWSLT 2014 evaluation campaign ... The test set is the tst2014 split and the
# validation set is created by concatenating the tst2010, tst2011, tst2012 and dev2010
# sets. The En<->Vi translation task is performed on the English to Vietnamese track of
# IWSLT 2015 ... The tst2013 ... and tst2012 ... are employed as the test and validation
# data. For the Fr<->En task, the dataset ... is from the IWSLT 2015 campaign. The test
# set is from the combination of the tst2014 and tst2015 splits. The validation set is
# the tst2013 set." (the splits are prepare_data.sh's recipes).
# Vocabulary: "a shared vocabulary via byte-pair-encoding (subword-nmt) ... The
# vocabularies for the ... Es<->En, En<->Vi, Ro<->En and Fr<->En translation tasks
# consist of ... 34k, 21k, 32k and 31k subword tokens" (vocabulary sizes; we learn as
# many merges). BLEU: "The translation quality for En<->Vi is reported based on the
# case-sensitive BLEU score computed with sacreBLEU. Finally, for the other IWSLT
# translation tasks, the case-sensitive BLEU metric evaluated with multi-bleu.pl":
# sacreBLEU for En<->Vi, multi-bleu style BLEU on Moses-tokenized text for the others.
# Each direction is prepared and trained on its own (the data-bin of a pair is checked
# for that direction by train.sh and evaluate.sh).
#   dataset|src|tgt|bpe size|bleu kind
PAIRS=(
    "iwslt15_en_vi|vi|en|21000|sacrebleu"
    "iwslt15_en_vi|en|vi|21000|sacrebleu"
    "iwslt14_es_en|es|en|34000|multi-bleu"
    "iwslt14_es_en|en|es|34000|multi-bleu"
    "iwslt15_fr_en|fr|en|31000|multi-bleu"
    "iwslt15_fr_en|en|fr|31000|multi-bleu"
    "iwslt14_ro_en|ro|en|32000|multi-bleu"
    "iwslt14_ro_en|en|ro|32000|multi-bleu"
)
PAPER_BLEU="En<->Vi: the case-sensitive BLEU score computed with sacreBLEU; the other IWSLT tasks: the case-sensitive BLEU metric evaluated with multi-bleu.pl"
BPE=subword-nmt

# Model (section 5.2): "For the low-resource (IWSLT) tasks, the model consists of
# 4-layer encoder and 4-layer decoder subnetworks each with hidden size and number of
# attention heads set as 256 and 4, respectively" (FFN 1024 = 4d: not stated); one
# embedding matrix for the shared vocabulary; "the filter size of the CNN unit ... is
# set to 2". Enc-DC by default; the rows choose the mode.
ARCH=dc_transformer_iwslt_small
MODEL_ARGS=(--share-all-embeddings)
METHOD_ARGS=(--dc-mode enc --dc-kernel-size 2)

# Recipe (section 5.3): "Adam (with beta1 = 0.9, beta2 = 0.98, eps = 10^9 [sic: 1e-9])";
# "the single-cosine-cycle with warm-up (So et al. 2019)": fairseq's cosine scheduler
# with one period from the end of the warm-up to the last update (200000 - 4000).
# Not stated: the peak learning rate, warm-up, dropout, label smoothing and weight
# decay: fairseq's IWSLT recipe (5e-4 after 4000 updates, dropout 0.3, label
# smoothing 0.1, weight decay 1e-4).
TRAIN_ARGS=(
    --optimizer adam --adam-betas '(0.9,0.98)' --adam-eps 1e-9
    --lr 5e-4 --lr-scheduler cosine --warmup-updates 4000 --warmup-init-lr 1e-7
    --lr-period-updates 196000 --t-mult 1 --min-lr 0
    --dropout 0.3 --weight-decay 0.0001
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1
    --max-tokens 2048
    --save-interval-updates 1000 --keep-interval-updates 5 --no-epoch-checkpoints
)
# "For the IWSLT tasks, the models are trained with a batch size of 2048 tokens and the
# number of training iterations is 200k." (The number of GPUs is not given: 2048 is
# taken as the whole batch, split over --gpus by the driver.)
MAX_UPDATE=200000
EFFECTIVE_TOKENS=2048
# Not stated; Vaswani et al.'s base recipe: the last 5 checkpoints.
AVERAGE_LAST=5
# "for the IWSLT tasks, the beam size and length penalty are 6 and 1.1, respectively."
# Maximum output length not stated: input + 50.
BEAM=6
LENPEN=1.1
GENERATE_ARGS=(--max-len-a 1 --max-len-b 50)
