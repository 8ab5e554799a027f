# The training recipes the paper configurations share (sourced by configs/papers/*.sh;
# not a configuration itself). Each function sets TRAIN_ARGS in one fixed order (the
# order is part of a run's SYSTEM signature); which of its values a paper states is
# labelled in each configuration, where the function is called.

# vaswani_recipe LR DROPOUT WEIGHT_DECAY KEEP: Vaswani et al. (2017)'s recipe: Adam
# (0.9, 0.98, eps 1e-9), lr = d^-0.5 min(step^-0.5, step warmup^-1.5) with 4000 warm-up
# steps (fairseq's inverse_sqrt with peak LR = d^-0.5 * 4000^-0.5), label smoothing
# 0.1; at most 4096 tokens per process and batch; a checkpoint every 1000 updates, the
# last KEEP kept.
vaswani_recipe() {
    TRAIN_ARGS=(
        --optimizer adam --adam-betas '(0.9,0.98)' --adam-eps 1e-9
        --lr "$1" --lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-7
        --dropout "$2" --weight-decay "$3"
        --criterion label_smoothed_cross_entropy --label-smoothing 0.1
        --max-tokens 4096
        --save-interval-updates 1000 --keep-interval-updates "$4" --no-epoch-checkpoints
    )
}

# cosine_recipe LR PERIOD DROPOUT WEIGHT_DECAY MAX_TOKENS: Adam (0.9, 0.98, eps 1e-9)
# and the single cosine cycle with warm-up (So et al. 2019): fairseq's cosine scheduler,
# 4000 warm-up updates to LR, then one period of PERIOD updates down to 0; label
# smoothing 0.1; a checkpoint every 1000 updates, the last 5 kept.
cosine_recipe() {
    TRAIN_ARGS=(
        --optimizer adam --adam-betas '(0.9,0.98)' --adam-eps 1e-9
        --lr "$1" --lr-scheduler cosine --warmup-updates 4000 --warmup-init-lr 1e-7
        --lr-period-updates "$2" --t-mult 1 --min-lr 0
        --dropout "$3" --weight-decay "$4"
        --criterion label_smoothed_cross_entropy --label-smoothing 0.1
        --max-tokens "$5"
        --save-interval-updates 1000 --keep-interval-updates 5 --no-epoch-checkpoints
    )
}
