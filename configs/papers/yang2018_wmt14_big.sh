# Yang et al. (2018): WMT14 En-De, Transformer-Big (Table 4). As the base setting
# (yang2018_wmt14_base.sh, read first) except for what follows.
. "$(dirname "${BASH_SOURCE[0]}")/yang2018_wmt14_base.sh"
DESCRIPTION="Yang et al. 2018, WMT14 En-De, Transformer-Big"

# "the Base and Big models, which differ at the layer size (512 vs. 1024) and the
# number of attention heads (8 vs. 16)" (FFN 4096, fairseq's vaswani big preset).
ARCH=localness_transformer_vaswani_wmt_en_de_big

# Vaswani et al.'s big En-De model (the paper follows their configuration): dropout 0.3;
# the lr formula at d = 1024: 1024^-0.5 * 4000^-0.5 = 5e-4; 20 checkpoints kept.
TRAIN_ARGS=(
    --optimizer adam --adam-betas '(0.9,0.98)' --adam-eps 1e-9
    --lr 5e-4 --lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-7
    --dropout 0.3 --weight-decay 0.0
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1
    --max-tokens 4096
    --save-interval-updates 1000 --keep-interval-updates 20 --no-epoch-checkpoints
)
# Not stated; Vaswani et al.'s big model: 300K steps.
MAX_UPDATE=300000
# Not stated; Vaswani et al.: the last 20 checkpoints of a big model.
AVERAGE_LAST=20
