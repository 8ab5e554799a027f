# Song et al. (2019): WMT14 En-De, big (Tables 2c and 3). As the base setting
# (song2019_wmt14_base.sh, read first) except for what follows.
. "$(dirname "${BASH_SOURCE[0]}")/song2019_wmt14_base.sh"
DESCRIPTION="Song et al. 2019, WMT14 En-De, big"

# "1024 dimensions for the big model"; 16 heads (FFN 4096: fairseq's vaswani big preset).
ARCH=hysan_transformer_vaswani_wmt_en_de_big

# eq. 15 at d = 1024: 1024^-0.5 * 4000^-0.5 = 5e-4. Dropout is not given: Vaswani et
# al.'s big En-De model, 0.3. 20 checkpoints kept for the average.
TRAIN_ARGS=(
    --optimizer adam --adam-betas '(0.9,0.98)' --adam-eps 1e-9
    --lr 5e-4 --lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-7
    --dropout 0.3 --weight-decay 0.0
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1
    --max-tokens 4096
    --save-interval-updates 1000 --keep-interval-updates 20 --no-epoch-checkpoints
)
# "... 300K steps for big model"; "averaging the last ... 20 checkpoints for the ... big model".
MAX_UPDATE=300000
AVERAGE_LAST=20
