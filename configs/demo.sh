# Configuration of `make demo` (scripts/demo.sh). Sourced by bash.
#
# The systems compared, in table order: one entry per system,
#     "<name>|<arch>|<extra fairseq-train args for this system only>"
# Every system is trained with the same data, model size (DEMO_MODEL_ARGS), recipe
# (DEMO_TRAIN_ARGS) and number of updates (DEMO_MAX_UPDATE); the extra args hold only
# what makes the system what it is (e.g. a locality option), so the table compares
# attention variants and nothing else. `make demo` runs DEMO_DEFAULT (the transformer and
# each model's main system, within 10 minutes on 2 cores); DEMO_ONLY="name1 name2" picks
# others, DEMO_ONLY=all runs every system below.
# Layer ranges are given for the demo's 2+2 layers where a model's default assumes
# more (localness: layers 1-3 of 6 in the paper; here both encoder layers).
# tests/test_demo_config.py builds every system below with these settings.
DEMO_SYSTEMS=(
    "transformer|transformer|"
    "localness|localness_transformer|--localness-encoder-layers 1-2"
    "hybrid-gate|hybrid_transformer|--hybrid-variant gate"
    "hysan|hysan_transformer|"
    "enc-dc|dc_transformer|--dc-mode enc"
    "dec-dc|dc_transformer|--dc-mode dec"
    "full-dc|dc_transformer|--dc-mode full"
    "localness-relpos|localness_transformer|--localness-encoder-layers 1-2 --localness-rel-pos"
    "local-pattern|hybrid_transformer|--hybrid-variant local_pattern"
    "transformer-nopos|transformer|--no-token-positional-embeddings"
    "hysan-nopos|hysan_transformer|--no-token-positional-embeddings"
)

DEMO_DEFAULT="transformer localness hybrid-gate hysan enc-dc dec-dc"

# Model size shared by all systems, and the learning-rate settings of the recipe: those
# of train.sh's tiny preset, configs/presets/tiny.sh, their one source (which describes
# them: 2+2 layers, d=64, ~0.25M parameters with the transformer; learning rate 2e-3).
. "$(dirname "${BASH_SOURCE[0]}")/presets/tiny.sh"
DEMO_MODEL_ARGS=("${TINY_MODEL_ARGS[@]}")

# Training recipe (overrides scripts/train.sh's Transformer-base defaults): the tiny
# preset's, then the demo's checkpoints and logging. Checkpoints every 15 updates: an
# update that ends an epoch (every 40 here) is saved only as an epoch checkpoint, so an
# interval dividing 40 would lose every other one.
DEMO_TRAIN_ARGS=(
    "${TINY_RECIPE_ARGS[@]}"
    --save-interval-updates 15 --keep-interval-updates 3 --no-epoch-checkpoints
    --log-interval 50 --num-workers 0
)
DEMO_MAX_UPDATE="${DEMO_MAX_UPDATE:-300}"
DEMO_SEED="${DEMO_SEED:-1}"
DEMO_AVERAGE_LAST=3        # average the last 3 update checkpoints (updates 270, 285, 300)

# Data: the embedded corpus (fairseq-localness-corpus) and its segmentation.
DEMO_SRC=src
DEMO_TGT=tgt
DEMO_CORPUS_ARGS=(--seed 1 --train-size 8000 --valid-size 400 --test-size 500)
DEMO_BPE_ARGS=(--method sentencepiece --vocab-size 1000)

# Decoding.
DEMO_BEAM=4
DEMO_LENPEN=1.0
