# Yang et al. (2018), "Modeling Localness for Self-Attention Networks": WMT14 En-De,
# Transformer-Base (Table 4). Sourced by bash (scripts/reproduce/common.sh); the
# variables are described in docs/reproduce.md. Quotes are from the paper (section 4.1
# unless said otherwise). Every variable is labelled: [paper] the paper's value, in
# its words; [*] this project's choice where the paper is silent, with the reason
# (mostly Vaswani et al. (2017), whose configuration the paper says it follows).
. "$(dirname "${BASH_SOURCE[0]}")/base/recipes.sh"
# [*] the setting's name in our tables.
DESCRIPTION="Yang et al. 2018, WMT14 En-De, Transformer-Base"

# [paper] "we trained on the widely-used WMT14 dataset consisting of about 4.56 million
# sentence pairs. The models were validated on newstest2013 and examined on
# newstest2014. ... tokenized using the scripts provided in Moses. Then, all tokenized
# sentences were processed by byte-pair encoding (BPE) ... with 32K merge operations";
# "The 4-gram NIST BLEU score (Papineni et al., 2002) is used as the evaluation metric".
# [*] NIST's mteval-v13a is reproduced by sacreBLEU's default 13a tokenization on the
# detokenized output (the main column). The paper does not say whether it is
# case-sensitive (mteval-v13a's default is not, its -c is): we report it cased, as Xu et
# al. (the same group, the same data) state. Tokenized BLEU with compound splitting, the
# convention of the Vaswani et al. numbers Table 4 lists, is an extra column.
#   dataset|src|tgt|bpe size|bleu kind[+extra kind]
PAIRS=("wmt14_en_de|en|de|32000|nist+tok-compound")
# [paper] the paper's words on its metric, quoted in the table's notes.
PAPER_BLEU="The 4-gram NIST BLEU score (Papineni et al., 2002) is used as the evaluation metric"
# [paper] "byte-pair encoding (BPE) (Sennrich et al., 2016)": subword-nmt.
BPE=subword-nmt

# [paper] "We tested both the Base and Big models, which differ at the layer size (512
# vs. 1024) and the number of attention heads (8 vs. 16)" (section 4.1); "a stack of
# L = 6 layers" (section 3.4).
ARCH=localness_transformer_wmt_en_de
# [*] one embedding matrix for source, target and output: fairseq's recipe for a joint
# BPE vocabulary. The paper's 88.0M counts THUMT's separate source embedding, so our
# count is smaller: the table marks it "(shared emb.)".
MODEL_ARGS=(--share-all-embeddings)
# [paper] what the paper's parameter count has (see MODEL_ARGS).
PAPER_EMBEDDINGS=separate
# [paper] "In the main experiments, we only applied localness modeling to the lower
# three layers of the encoder, which employs a query-specific window prediction
# strategy" (section 4.3). The baseline rows train fairseq's transformer without these.
METHOD_ARGS=(--localness-window query --localness-encoder-layers 1-3)

# [paper] "We followed Vaswani et al. (2017) to set the configurations".
# [*] their base recipe, which the paper does not spell out: Adam (0.9, 0.98, eps
# 1e-9); lr = d^-0.5 min(step^-0.5, step warmup^-1.5) with 4000 warm-up steps, i.e.
# inverse_sqrt with peak 512^-0.5 * 4000^-0.5 = 7e-4; dropout 0.1; label smoothing 0.1;
# no weight decay. Checkpoints every 1000 updates (Vaswani et al.: every 10 minutes,
# ~700 steps at the paper's 1.2 steps/s), the last AVERAGE_LAST kept.
vaswani_recipe 7e-4 0.1 0.0 5
# [*] not stated; Vaswani et al.'s base model: 100K steps.
MAX_UPDATE=100000
# [paper] "All the models were trained on eight NVIDIA P40 GPUs, each of which is
# allocated a batch of 4096 tokens": 8 x 4096.
EFFECTIVE_TOKENS=32768
# [*] not stated; Vaswani et al.: the last 5 checkpoints of a base model.
AVERAGE_LAST=5
# [*] not stated; Vaswani et al.: beam 4, length penalty 0.6, maximum output length
# input + 50. (fairseq's --lenpen divides by length^0.6, not GNMT's ((5+len)/6)^0.6.)
BEAM=4
LENPEN=0.6
GENERATE_ARGS=(--max-len-a 1 --max-len-b 50)
