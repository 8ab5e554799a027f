# The rows of a reproduce script (sourced by common.sh): checked and selected
# (reproduce_load_rows, through plan.py), their data (prepare_data.py plan), run
# directories per seed, result files, fairseq-train options and signatures.

# ------------------------------------------------------------------ data plans
# plan_specs SPEC...: each SPEC the prepare_data.py options of one request (a string);
# sets PLANS[SPEC] to the shell assignments of its plan (NAME, VARIANT, VARIANTS, TEST,
# DOWNLOAD, MANUAL: see fairseq-localness-prepare plan), read from the datasets'
# manifests in one Python call (no fairseq import); with --variant, the datasets that
# have that variant get it (--prefer-variant).
declare -A PLANS=()
plan_specs() {
    local specs=("$@") first=() prefer=() out block k=0
    read -r -a first <<< "${specs[0]}"
    [[ -n "$VARIANT_CHOICE" ]] && prefer=(--prefer-variant "$VARIANT_CHOICE")
    out="$(printf '%s\n' "${specs[@]:1}" | "$PY" "$SCRIPTS_DIR/prepare_data.py" --prog "$PROG" plan \
        "${first[@]}" "${prefer[@]}" --more)" || exit 2
    while IFS= read -r -d $'\034' block; do
        PLANS["${specs[$k]}"]="$block"
        k=$((k + 1))
    done < <(awk -v RS='\n--\n' '{ printf "%s\034", $0 }' <<< "$out")
    (( k == ${#specs[@]} )) || die "prepare_data.py plan: expected ${#specs[@]} plans, got $k"
}

# plan_of SPEC: PLAN_NAME, PLAN_VARIANT, PLAN_VARIANTS, PLAN_TEST, PLAN_DOWNLOAD, PLAN_MANUAL.
plan_of() {
    local NAME="" VARIANT="" VARIANTS="" TEST="" DOWNLOAD="" MANUAL="" VARIANT_DESCRIPTION="" BPE_JOINT=""
    eval "${PLANS[$1]}"
    PLAN_NAME="$NAME" PLAN_VARIANT="$VARIANT" PLAN_VARIANTS="$VARIANTS" PLAN_TEST="$TEST"
    PLAN_DOWNLOAD="$DOWNLOAD" PLAN_MANUAL="$MANUAL"
}

# ------------------------------------------------------------------ rows
# Parse and check every row (not only the selected ones), loading its configuration.
reproduce_load_rows() {
    R_NAME=() R_CFG=() R_PAIR=() R_EXTRA=() R_BLEU=() R_BASE=() R_PARAMS=() R_SPEED=()
    R_ARCH=() R_KIND=() R_XKIND=() R_DATASET=() R_VARIANT=() R_TEST=() R_DATA=() R_SRC=() R_TGT=()
    R_RUN=() R_TRAINING=() R_PAPER_BLEU=() R_SHARES=() R_DOWNLOAD=() R_MANUAL=() R_SPEC=()
    VARIANT_CHOICE="$VARIANT"
    (( ${#TABLE_ROWS[@]} )) || die "TABLE_ROWS is empty"
    # the rows' fields, checked, and --only's selection (scripts/reproduce/plan.py)
    local lines name cfg pair arch extra bleu base params speed sel i variant_used=0 words=()
    lines="$(printf '%s\n' "${TABLE_ROWS[@]}" \
        | "$PY" "$REPRO_DIR/plan.py" --prog "$PROG" rows --title "$TABLE_TITLE" --only "$ONLY")" || exit 2
    SELECTED=()
    while IFS=$'\x1f' read -r name cfg pair arch extra bleu base params speed sel; do
        (( sel )) && SELECTED+=("${#R_NAME[@]}")
        load_config "$cfg"
        pair_of "$pair" || case $? in
            1) die "row '$name': configuration $cfg has no direction '$pair'; its directions: $PAIR_KEYS" ;;
            *) die "row '$name': configuration $cfg has several directions; name one as '$cfg:<src>-<tgt>'" ;;
        esac
        read -r -a words <<< "$extra"
        arch="${arch:-$ARCH}"
        # the BLEU of the main column (--bleu replaces the paper's) and the extra one; one
        # tokenized BLEU per row (evaluate.sh writes one)
        local kind="${BLEU_OVERRIDE:-$P_KIND}" xkind="$P_EXTRA"
        [[ "$xkind" == "$kind" ]] && xkind=""
        if [[ "$xkind" == multi-bleu || "$xkind" == tok-compound ]] && [[ "$kind" == multi-bleu || "$kind" == tok-compound ]]; then
            xkind=""
        fi
        local training="$TRAINING"
        [[ "$TRAINING_CHOICE" != paper ]] && training="$TRAINING_CHOICE"
        R_SPEC+=("--dataset $P_DATASET --src $P_SRC --tgt $P_TGT --bpe $BPE --bpe-size $P_BPE_SIZE --bpe-joint $BPE_JOINT")
        # our run shares the embeddings where the paper's parameter count has separate ones
        local shares=0
        [[ " ${MODEL_ARGS[*]} " == *" --share-all-embeddings "* && "$PAPER_EMBEDDINGS" == separate ]] && shares=1
        R_NAME+=("$name") R_CFG+=("$cfg") R_PAIR+=("$pair") R_EXTRA+=("${words[*]}")
        R_BLEU+=("$bleu") R_BASE+=("$base") R_PARAMS+=("$params") R_SPEED+=("$speed")
        R_ARCH+=("$arch") R_KIND+=("$kind") R_XKIND+=("$xkind") R_SRC+=("$P_SRC") R_TGT+=("$P_TGT")
        R_DATASET+=("$P_DATASET") R_RUN+=("$WORK/runs/$name") R_TRAINING+=("$training")
        R_PAPER_BLEU+=("$PAPER_BLEU") R_SHARES+=("$shares")
    done <<< "$lines"
    # the data of every row: its prepared directory, variant, test set and downloads
    local specs=() spec
    for spec in "${R_SPEC[@]}"; do
        [[ -n "${PLANS[$spec]:-}" ]] && continue
        PLANS[$spec]=pending
        specs+=("$spec")
    done
    plan_specs "${specs[@]}"
    for i in "${!R_NAME[@]}"; do
        plan_of "${R_SPEC[$i]}"
        [[ -n "$VARIANT" && "$PLAN_VARIANT" == "$VARIANT" ]] && variant_used=1
        R_VARIANT+=("$PLAN_VARIANT") R_TEST+=("$PLAN_TEST") R_DOWNLOAD+=("$PLAN_DOWNLOAD") R_MANUAL+=("$PLAN_MANUAL")
        R_DATA+=("$DATA_DIR/$PLAN_NAME")
    done
    if [[ -n "$VARIANT" ]] && (( ! variant_used )); then
        die "--variant: no dataset of ${TABLE_TITLE%%:*} has a variant '$VARIANT' (see \
'scripts/prepare_data.py list' for the datasets' variants)"
    fi
    return 0
}

# ------------------------------------------------------------------ seeds
# seed_run_dir i SEED: RUN_DIR, the run directory of row i with SEED: WORK/runs/<row> for
# a single seed (as always), WORK/runs/<row>/seed<SEED> with several, except that a
# one-seed run already in WORK/runs/<row> is SEED's run when it was trained with SEED and
# the row's settings (its SYSTEM is the row's signature with SEED).
seed_run_dir() {
    local i="$1" top="$WORK/runs/${R_NAME[$1]}" seed="$SEED"
    RUN_DIR="$top"
    (( ${#SEEDS[@]} > 1 )) || return 0
    if [[ -f "$top/SYSTEM" ]]; then
        SEED="$2"
        row_signature "$i"
        SEED="$seed"
        [[ "$(cat "$top/SYSTEM")" == "$SIGNATURE" ]] && return 0
    fi
    RUN_DIR="$top/seed$2"
}

# use_seed SEED: the runs of SEED: --seed and every row's run directory (R_RUN).
use_seed() {
    local i
    SEED="$1"
    for i in "${!R_NAME[@]}"; do
        seed_run_dir "$i" "$SEED"
        R_RUN[$i]="$RUN_DIR"
    done
}

# ------------------------------------------------------------------ a row's files, options and signature
# kind_json KIND RUN_DIR: sets KIND_JSON, the score file of a BLEU kind ("" for none).
kind_json() {
    case "$1" in
        nist|sacrebleu) KIND_JSON="$2/eval/bleu.json" ;;
        "") KIND_JSON="" ;;
        *) KIND_JSON="$2/eval/tok_bleu.json" ;;
    esac
}
# row_files i: the result files of row i (with its configuration loaded): ROW_SCORE
# (the main column's score), ROW_XSCORE (the extra column's), ROW_CKPT (the checkpoint
# that is translated: the average of the last AVERAGE_LAST, or checkpoint_best.pt),
# and TRAINING_TEXT (the training in words). Globals, no subshells (set for every row).
row_files() {
    local i="$1" run="${R_RUN[$1]}" whose="the paper's"
    kind_json "${R_KIND[$i]}" "$run"
    ROW_SCORE="$KIND_JSON"
    kind_json "${R_XKIND[$i]}" "$run"
    ROW_XSCORE="$KIND_JSON"
    [[ "${R_TRAINING[$i]}" != "$TRAINING" ]] && whose="an alternative to the paper's"
    if [[ "${R_TRAINING[$i]}" == early-stop ]]; then
        ROW_CKPT="$run/checkpoint_best.pt"
        TRAINING_TEXT="early stopping on dev BLEU (patience ${PATIENCE_OVERRIDE:-$PATIENCE} validations, one every \
$CFG_SAVE_INTERVAL updates; at most $MAX_UPDATE updates), checkpoint_best.pt ($whose)"
    else
        ROW_CKPT="$run/checkpoint_avg_last${AVERAGE_LAST}.pt"
        TRAINING_TEXT="$MAX_UPDATE updates, average of the last $AVERAGE_LAST checkpoints ($whose)"
    fi
}

# early_stop_args i: fairseq-train's options for early stopping on development BLEU
# (fairseq's --eval-bleu with the paper's beam and length penalty on the detokenized
# output, sacreBLEU as the papers' NIST BLEU; validation at each checkpoint;
# CFG_EVAL_BLEU_ARGS: plan.py config's).
early_stop_args() {
    local i="$1" detok=space remove=sentencepiece
    [[ "$BPE" == subword-nmt ]] && detok=moses remove=subword_nmt
    EARLY_ARGS=(--eval-bleu --eval-bleu-args "$CFG_EVAL_BLEU_ARGS" --eval-bleu-detok "$detok")
    [[ "$detok" == moses ]] && EARLY_ARGS+=(--eval-bleu-detok-args "{\"target_lang\": \"${R_TGT[$i]}\"}")
    EARLY_ARGS+=(--eval-bleu-remove-bpe "$remove" --best-checkpoint-metric bleu --maximize-best-checkpoint-metric
                 --patience "${PATIENCE_OVERRIDE:-$PATIENCE}" --validate-interval-updates "$CFG_SAVE_INTERVAL")
}

# system_signature i words...: SIGNATURE, what makes a run what it is; a run directory
# trained with another one is refused.
system_signature() {
    local i="$1"
    shift
    printf -v SIGNATURE '%s\n' "arch ${R_ARCH[$i]}" "data ${R_DATA[$i]##*/}" "pair ${R_SRC[$i]}-${R_TGT[$i]}" \
        "max-update $MAX_UPDATE" "effective-tokens $EFFECTIVE_TOKENS" "seed $SEED" "args $*"
    SIGNATURE="${SIGNATURE%$'\n'}"
}

# row_signature i: load row i's configuration and direction; sets FAIRSEQ_ARGS (the
# fairseq-train options: the configuration's, the method's unless the row trains
# another architecture, then the row's, then early stopping's) and SIGNATURE (with
# the seed SEED).
row_signature() {  # i
    local i="$1"
    load_config "${R_CFG[$i]}"
    pair_of "${R_PAIR[$i]}"
    local extra=() method=()
    read -r -a extra <<< "${R_EXTRA[$i]}"
    [[ "${R_ARCH[$i]}" == "$ARCH" ]] && method=("${METHOD_ARGS[@]}")
    EARLY_ARGS=()
    [[ "${R_TRAINING[$i]}" == early-stop ]] && early_stop_args "$i"
    FAIRSEQ_ARGS=("${MODEL_ARGS[@]}" "${TRAIN_ARGS[@]}" "${method[@]}" "${extra[@]}" "${EARLY_ARGS[@]}")
    system_signature "$i" "${FAIRSEQ_ARGS[@]}"
}

# load_row i: row_signature, and stop if the row's run directory was trained with other
# settings or the paper's batch cannot be split; sets BATCH_TEXT.
load_row() {  # i
    local i="$1" run_dir="${R_RUN[$1]}"
    row_signature "$i"
    if [[ -f "$run_dir/SYSTEM" ]] && [[ "$(cat "$run_dir/SYSTEM")" != "$SIGNATURE" ]]; then
        die "row '${R_NAME[$i]}': $run_dir was trained with other settings (see $run_dir/SYSTEM); \
use another --work-dir, or remove that directory to train again"
    fi
    # the paper's batch over the processes (train.sh computes the same, and also checks
    # that the longest training pair fits)
    BATCH_PROCS=$GPUS
    (( CPU )) && BATCH_PROCS=1
    (( REHEARSE )) && BATCH_PROCS=$REHEARSE_PROCS
    batch_split "$EFFECTIVE_TOKENS" "$BATCH_PROCS" "${MAX_TOKENS:-$CFG_MAX_TOKENS}" \
        || die "row '${R_NAME[$i]}' (${R_CFG[$i]}): the paper's batch: $BATCH_ERROR"
}

# prepare_args i: prepare_data.sh's options for row i's data.
prepare_args() {
    local i="$1"
    PREP_ARGS=(--dataset "${R_DATASET[$i]}" --raw-dir "$(raw_dir_of "${R_DATASET[$i]}")" --out "${R_DATA[$i]}"
               --src "${R_SRC[$i]}" --tgt "${R_TGT[$i]}" --bpe "$BPE" --bpe-size "$P_BPE_SIZE" --bpe-joint "$BPE_JOINT")
    [[ -n "${R_VARIANT[$i]}" ]] && PREP_ARGS+=(--variant "${R_VARIANT[$i]}")
    (( DOWNLOAD )) && PREP_ARGS+=(--download)
    return 0
}
