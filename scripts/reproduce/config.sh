# The paper configurations (configs/papers/<name>.sh) of the reproduce driver: read and
# checked (load_config), and the direction a row picks (pair_of). Sourced by common.sh.

# (the same lists as plan.py's BLEU_KINDS and TRAININGS, which check the options)
BLEU_KINDS=(nist sacrebleu multi-bleu tok-compound)
TRAININGS=(fixed early-stop)
# What a configuration file defines (reset before each one is read), and the optional
# ones with their defaults.
CONFIG_VARS=(DESCRIPTION PAIRS BPE ARCH MODEL_ARGS METHOD_ARGS TRAIN_ARGS MAX_UPDATE
             EFFECTIVE_TOKENS AVERAGE_LAST BEAM LENPEN GENERATE_ARGS PAPER_BLEU)
config_defaults() {
    BPE_JOINT=yes TRAINING=fixed PATIENCE=10 PAPER_EMBEDDINGS=shared
}
# Options the driver and train.sh set themselves; a configuration or row must not.
RESERVED_OPTS=(--max-update --update-freq --seed --save-dir --arch --cpu --log-file
               --source-lang --target-lang --user-dir --task --fp16 --bf16 --restore-file
               --eval-bleu --patience --best-checkpoint-metric)

# config_names: the configurations that exist, for error messages.
config_names() {
    local f names=()
    for f in "$CONFIG_DIR"/*.sh; do
        [[ -f "$f" ]] && names+=("$(basename "$f" .sh)")
    done
    echo "${names[*]:-(none)}"
}

# cfg_die MESSAGE: an error in the configuration file being loaded.
cfg_die() {
    die "configuration $CFG_FILE: $*"
}

# check_reserved WHERE WORD...: none of the words is an option the driver owns.
check_reserved() {
    local where="$1" w r
    shift
    for w in "$@"; do
        for r in "${RESERVED_OPTS[@]}"; do
            [[ "$w" == "$r" ]] && die "$where: '$r' is set by the reproduce driver and train.sh \
(--max-update from MAX_UPDATE, --update-freq from EFFECTIVE_TOKENS, --seed/--cpu/--precision \
from the command line, the architecture from ARCH or a row's leading --arch, early stopping from TRAINING); remove it"
        done
    done
    return 0
}

# load_config NAME: read configs/papers/NAME.sh and check every value it sets.
load_config() {
    local name="$1"
    CFG_FILE="$CONFIG_DIR/$name.sh"
    [[ "$name" =~ ^[A-Za-z0-9_.-]+$ && -f "$CFG_FILE" ]] \
        || die "no configuration '$name' (expected $CONFIG_DIR/$name.sh); configurations: $(config_names)"
    unset "${CONFIG_VARS[@]}"
    config_defaults
    # shellcheck disable=SC1090
    . "$CFG_FILE"
    local v
    for v in "${CONFIG_VARS[@]}"; do
        declare -p "$v" &>/dev/null || cfg_die "$v is not set (every configuration sets: ${CONFIG_VARS[*]})"
    done
    require_choice "$CFG_FILE: BPE" "$BPE" subword-nmt sentencepiece
    require_choice "$CFG_FILE: BPE_JOINT" "$BPE_JOINT" yes no
    require_choice "$CFG_FILE: TRAINING" "$TRAINING" "${TRAININGS[@]}"
    require_choice "$CFG_FILE: PAPER_EMBEDDINGS" "$PAPER_EMBEDDINGS" shared separate
    [[ -n "$ARCH" ]] || cfg_die "ARCH is empty"
    [[ -n "$PAPER_BLEU" ]] || cfg_die "PAPER_BLEU is empty; expected the paper's words on its BLEU"
    require_int "$CFG_FILE: MAX_UPDATE" "$MAX_UPDATE" 1
    require_int "$CFG_FILE: EFFECTIVE_TOKENS" "$EFFECTIVE_TOKENS" 1
    require_int "$CFG_FILE: AVERAGE_LAST" "$AVERAGE_LAST" 1
    require_int "$CFG_FILE: PATIENCE" "$PATIENCE" 1
    require_int "$CFG_FILE: BEAM" "$BEAM" 1
    require_float "$CFG_FILE: LENPEN" "$LENPEN"
    (( ${#PAIRS[@]} )) || cfg_die "PAIRS is empty; expected entries 'dataset|src|tgt|bpe size|bleu kind[+extra kind]'"
    local entry dataset src tgt size kinds kind extra keys=" "
    for entry in "${PAIRS[@]}"; do
        IFS='|' read -r dataset src tgt size kinds <<< "$entry"
        require_choice "$CFG_FILE: PAIRS entry '$entry': dataset" "$dataset" "${DATASETS[@]}"
        require_lang "$CFG_FILE: PAIRS entry '$entry': source language" "$src"
        require_lang "$CFG_FILE: PAIRS entry '$entry': target language" "$tgt"
        require_int "$CFG_FILE: PAIRS entry '$entry': bpe size" "$size" 1
        kind="${kinds%%+*}" extra=""
        [[ "$kinds" == *+* ]] && extra="${kinds#*+}"
        require_choice "$CFG_FILE: PAIRS entry '$entry': bleu kind" "$kind" "${BLEU_KINDS[@]}"
        [[ -z "$extra" ]] || require_choice "$CFG_FILE: PAIRS entry '$entry': extra bleu kind" "$extra" "${BLEU_KINDS[@]}"
        [[ "$keys" != *" $src-$tgt "* ]] || cfg_die "PAIRS lists the direction $src-$tgt twice"
        keys+="$src-$tgt "
    done
    check_reserved "$CFG_FILE: MODEL_ARGS" "${MODEL_ARGS[@]}"
    check_reserved "$CFG_FILE: METHOD_ARGS" "${METHOD_ARGS[@]}"
    check_reserved "$CFG_FILE: TRAIN_ARGS" "${TRAIN_ARGS[@]}"
    local mt="" siu="" kiu="" prev="" w
    for w in "${TRAIN_ARGS[@]}"; do  # (no subshells: configurations are loaded once per row and step)
        case "$prev" in
            --max-tokens) mt="$w" ;;
            --save-interval-updates) siu="$w" ;;
            --keep-interval-updates) kiu="$w" ;;
        esac
        prev="$w"
    done
    [[ -n "$mt" ]] || cfg_die "TRAIN_ARGS has no --max-tokens (the most tokens per process and batch; EFFECTIVE_TOKENS is split within it)"
    require_int "$CFG_FILE: --max-tokens in TRAIN_ARGS" "$mt" 1
    [[ -n "$siu" ]] || cfg_die "TRAIN_ARGS has no --save-interval-updates (the last AVERAGE_LAST update checkpoints are averaged)"
    require_int "$CFG_FILE: --keep-interval-updates in TRAIN_ARGS" "${kiu:-0}" "$AVERAGE_LAST"
    CFG_MAX_TOKENS="$mt" CFG_SAVE_INTERVAL="$siu"
    rehearse_config
}

# pair_of SPEC: sets P_DATASET P_SRC P_TGT P_BPE_SIZE P_KIND P_EXTRA from the loaded
# configuration's PAIRS: SPEC is 'src-tgt', or empty when there is one pair.
pair_of() {
    local want="$1" entry dataset src tgt size kinds found="" keys=()
    for entry in "${PAIRS[@]}"; do
        IFS='|' read -r dataset src tgt size kinds <<< "$entry"
        keys+=("$src-$tgt")
        if [[ -z "$want" || "$want" == "$src-$tgt" ]]; then
            [[ -z "$found" ]] || return 2
            found=1 P_DATASET="$dataset" P_SRC="$src" P_TGT="$tgt" P_BPE_SIZE="$size"
            P_KIND="${kinds%%+*}" P_EXTRA=""
            (( REHEARSE )) && P_BPE_SIZE=$REHEARSE_BPE_SIZE
            [[ "$kinds" == *+* ]] && P_EXTRA="${kinds#*+}"
        fi
    done
    [[ -n "$found" ]] || { PAIR_KEYS="${keys[*]}"; return 1; }
}
