# --rehearse: the whole path of a reproduce script, for real, on the CPU in minutes.
# Sourced by common.sh, do not run it.
#
# A rehearsal runs the same rows and the same steps as the real run: data preparation
# (prepare_data.sh on a small fake of each dataset's raw download, written by
# fairseq_localness/data/fakes.py in the original formats: extraction, cleaning, word
# segmentation, the subword model, binarization), training with the row's own options,
# averaging (or early stopping), decoding, the paper's metric, the significance test
# and the results table. Only sizes change (the values below): a tiny model, a small
# subword model, small batches and a few updates. Rows whose paper batch spans several
# GPUs (the configuration's EFFECTIVE_TOKENS above its --max-tokens), and every row
# with --gpus N > 1, train in two processes on the CPU (train.sh --gpus 2 --cpu: gloo),
# as a distributed run does. The numbers of the table mean nothing; what is rehearsed
# is that every step runs and hands the next one what it needs.
#
# Everything goes under the work directory (default runs/rehearse/<script>):
# downloads/<dataset> (the fakes), data/ (prepared), runs/, results.md.

# The sizes of a rehearsal: 3 encoder layers (Yang et al.'s localness and Xu et al.'s
# LOCAL_S use layers 1-3), 2 decoder layers, d = 32, FFN 64, 2 heads.
REHEARSE=0  # (set by --rehearse)
REHEARSE_SIZES=(--encoder-layers 3 --decoder-layers 2 --encoder-embed-dim 32 --decoder-embed-dim 32
                --encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64
                --encoder-attention-heads 2 --decoder-attention-heads 2)
REHEARSE_FAKE_SCALE=100   # the fakes' training sentences x this: a few thousand pairs, so
                          # that an epoch is longer than the rehearsal's updates (fairseq
                          # saves no update checkpoint at the end of an epoch)
REHEARSE_MAX_TOKENS=128   # per process and batch
REHEARSE_BPE_SIZE=100     # subword merges or pieces
REHEARSE_MAX_ACCUMULATE=4 # at most this many batches of REHEARSE_MAX_TOKENS per update

# rehearse_options: after the options are parsed; sets the rehearsal's directories
# and devices, and refuses what a rehearsal decides itself.
rehearse_options() {
    local script_name="$1"
    (( REHEARSE )) || return 0
    [[ -z "$RAW_ROOT" && ${#RAW_DIRS[@]} -eq 0 ]] || die "--rehearse and --raw-dir: a rehearsal prepares \
small fakes of the raw downloads (in WORK/downloads); expected one of them, not both"
    [[ -z "$DATA_DIR" ]] || die "--rehearse and --data-dir: a rehearsal prepares its data in WORK/data; \
expected one of them, not both"
    (( ! DOWNLOAD )) || die "--rehearse and --download: a rehearsal downloads nothing; expected one of them, not both"
    [[ -z "$MAX_TOKENS" ]] || die "--rehearse and --max-tokens: a rehearsal sets the batch itself \
($REHEARSE_MAX_TOKENS tokens per process); expected one of them, not both"
    (( ! CPU )) || die "--rehearse and --cpu: a rehearsal always runs on the CPU; leave --cpu out"
    WORK="${WORK:-$REPO_DIR/runs/rehearse/$script_name}"
    WORK="${WORK%/}"
    DATA_DIR="$WORK/data" RAW_ROOT="$WORK/downloads"
    CPU=1
    TABLE_TITLE+=" (rehearsal: tiny models, a few updates, fake data; the numbers mean nothing)"
}

# rehearse_config: at the end of load_config; replaces the sizes of the loaded
# configuration (and only those). REHEARSE_PROCS: the row's processes.
rehearse_config() {
    (( REHEARSE )) || return 0
    local ratio=$(( (EFFECTIVE_TOKENS + CFG_MAX_TOKENS - 1) / CFG_MAX_TOKENS ))
    REHEARSE_PROCS=1
    (( ratio > 1 || GPUS > 1 )) && REHEARSE_PROCS=2
    (( ratio > REHEARSE_MAX_ACCUMULATE )) && ratio=$REHEARSE_MAX_ACCUMULATE
    (( ratio < REHEARSE_PROCS )) && ratio=$REHEARSE_PROCS
    EFFECTIVE_TOKENS=$(( REHEARSE_MAX_TOKENS * ratio ))
    # one checkpoint per update, the last AVERAGE_LAST averaged (or the best one, for
    # early stopping: one validation per update)
    MAX_UPDATE=$(( AVERAGE_LAST + 1 ))
    TRAIN_ARGS+=("${REHEARSE_SIZES[@]}" --max-tokens "$REHEARSE_MAX_TOKENS"
                 --save-interval-updates 1 --keep-interval-updates "$AVERAGE_LAST")
    CFG_MAX_TOKENS=$REHEARSE_MAX_TOKENS CFG_SAVE_INTERVAL=1
}

# rehearse_fakes: the fake raw download of every selected dataset that has no prepared
# data and no raw directory yet (emit: printed by --dry-run).
rehearse_fakes() {
    (( REHEARSE )) || return 0
    local i seen=" " raw
    for i in "${SELECTED[@]}"; do
        [[ "$seen" == *" ${R_DATASET[$i]} "* ]] && continue
        seen+="${R_DATASET[$i]} "
        raw="$(raw_dir_of "${R_DATASET[$i]}")"
        [[ -d "$raw" ]] && continue
        slurm_job "prepare:${R_DATASET[$i]}" prepare "$i"
        emit "$PY" "$REPO_DIR/fairseq_localness/data/fakes.py" "${R_DATASET[$i]}" "$raw" --scale "$REHEARSE_FAKE_SCALE"
    done
}
