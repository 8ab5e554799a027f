# "Dual contextual module for neural machine translation": the IWSLT tasks
# {Vi, Es, Fr, Ro} <-> En (Table 2). Sourced by bash (scripts/reproduce/common.sh);
# the variables are described in docs/reproduce.md. What the paper's settings share
# is in base/dc.sh (read first). Labels: [paper], [*] (docs/reproduce.md).
. "$(dirname "${BASH_SOURCE[0]}")/base/dc.sh"
# [*] the setting's name in our tables.
DESCRIPTION="Dual Contextual module, IWSLT {Vi,Es,Fr,Ro}<->En, 4 layers, d=256"

# [paper] (section 5.1) "For the Es↔En and Ro↔En tasks, the datasets employed are
# respectively from the Spanish-to-English and Romanian-to-English translation tracks
# of the IWSLT 2014 evaluation campaign ... The test set is the tst2014 split and the
# validation set is created by concatenating the tst2010, tst2011, tst2012 and dev2010
# sets. The En↔Vi translation task is performed on the English to Vietnamese track of
# IWSLT 2015 ... The tst2013 ... and tst2012 ... are employed as the test and
# validation data, respectively. For the Fr↔En task, the data-set ... is from the IWSLT
# 2015 campaign. The test set is from the combination of the tst2014 and tst2015
# splits. The validation set is the tst2013 set." (the splits are prepare_data.sh's
# recipes); the vocabularies of 34k, 21k, 32k and 31k (base/dc.sh); "The translation
# quality for En↔Vi is reported based on the case-sensitive BLEU score computed with
# sacreBLEU. Finally, for the other IWSLT translation tasks, the case-sensitive BLEU
# metric evaluated with multi-bleu.pl": sacreBLEU for En<->Vi, multi-bleu style BLEU
# on Moses-tokenized text for the others. [*] Each direction is prepared and trained on
# its own (the data-bin of a pair is checked for that direction by train.sh and
# evaluate.sh).
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
# [paper] the paper's words on its metric, quoted in the table's notes.
PAPER_BLEU="En<->Vi: the case-sensitive BLEU score computed with sacreBLEU; the other IWSLT tasks: the case-sensitive BLEU metric evaluated with multi-bleu.pl"

# [paper] (section 5.2) "For the low-resource (IWSLT) tasks, the model consists of
# 4-layer encoder and 4-layer decoder subnetworks each with hidden size and number of
# attention heads set as 256 and 4, respectively". [*] FFN 1024 = 4d: not stated.
ARCH=dc_transformer_iwslt_small

# [paper] the recipe of base/dc.sh, with one cosine period of 200000 - 4000 updates.
# [*] not stated: the peak learning rate, dropout and weight decay: fairseq's IWSLT
# recipe (5e-4, dropout 0.3, weight decay 1e-4).
dc_recipe 5e-4 196000 0.3 0.0001 2048
# [paper] "For the IWSLT tasks, the models are trained with a batch size of 2048 tokens
# and the number of training iterations is 200k." [*] The number of GPUs is not given:
# 2048 is taken as the whole batch, split over --gpus by the driver.
MAX_UPDATE=200000
EFFECTIVE_TOKENS=2048
# [paper] "for the IWSLT tasks, the beam size and length penalty are 6 and 1.1,
# respectively."
BEAM=6
LENPEN=1.1
