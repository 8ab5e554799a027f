# scripts/train.sh --preset tiny: a small model and a short-schedule recipe for a first
# run on the CPU (sourced by train.sh), and the one source of the demo's model and
# learning-rate settings (configs/demo.sh reads TINY_MODEL_ARGS and TINY_RECIPE_ARGS
# from here): 2+2 layers, d=64, 4 heads, FFN 256, one embedding matrix for source,
# target and output (245,760 parameters for the transformer on the demo's corpus; it
# needs preprocess.sh's joined dictionary, the default), learning rate 2e-3 with 100
# warm-up updates, gradient clipping at 1.0, dropout 0.1, batches of at most 2048
# tokens, data loading in the training process. On the demo's corpus (8,000 sentence
# pairs) 300 updates take 40-55 s on one core (the demo's transformer: 88.6 BLEU in
# docs/results.md).
#
# PRESET_ARGS come after train.sh's Transformer-base defaults and before the arguments
# after --, which override them (e.g. `-- --max-tokens 4096`). A preset of your own:
# configs/presets/NAME.sh setting PRESET_ARGS, used as --preset NAME.
TINY_MODEL_ARGS=(
    --encoder-layers 2 --decoder-layers 2
    --encoder-embed-dim 64 --decoder-embed-dim 64
    --encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256
    --encoder-attention-heads 4 --decoder-attention-heads 4
    --share-all-embeddings
)
# Gradient clipping keeps the short, high learning-rate schedule from ending on a loss
# spike.
TINY_RECIPE_ARGS=(--lr 2e-3 --warmup-updates 100 --clip-norm 1.0 --dropout 0.1 --max-tokens 2048)
PRESET_ARGS=("${TINY_MODEL_ARGS[@]}" "${TINY_RECIPE_ARGS[@]}" --num-workers 0)
