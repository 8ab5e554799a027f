# The paper configurations (configs/papers/<name>.sh) of the reproduce driver: read and
# checked (load_config), and the direction a row picks (pair_of). Sourced by common.sh.

# What a configuration file defines (reset before each one is read), and the optional
# ones with their defaults.
CONFIG_VARS=(DESCRIPTION PAIRS BPE ARCH MODEL_ARGS METHOD_ARGS TRAIN_ARGS MAX_UPDATE
             EFFECTIVE_TOKENS AVERAGE_LAST BEAM LENPEN GENERATE_ARGS PAPER_BLEU)
config_defaults() {
    BPE_JOINT=yes TRAINING=fixed PATIENCE=10 PAPER_EMBEDDINGS=shared
}
# The configurations checked so far: name -> plan.py config's output (CFG_MAX_TOKENS,
# CFG_SAVE_INTERVAL, CFG_EVAL_BLEU_ARGS); each is checked once per run.
declare -A CONFIG_CHECKED=()

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

# config_values: the loaded configuration's variables for plan.py config: for each,
# NUL-separated, its name, its number of values and the values.
config_values() {
    local v ref vals
    for v in "${CONFIG_VARS[@]}" BPE_JOINT TRAINING PATIENCE PAPER_EMBEDDINGS; do
        ref="$v[@]"
        vals=("${!ref}")
        printf '%s\0%s\0' "$v" "${#vals[@]}"
        if (( ${#vals[@]} )); then printf '%s\0' "${vals[@]}"; fi
    done
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
    # every value checked (scripts/reproduce/plan.py), once per configuration and run
    if [[ -z "${CONFIG_CHECKED[$name]:-}" ]]; then
        CONFIG_CHECKED[$name]="$(config_values | "$PY" "$REPRO_DIR/plan.py" --prog "$PROG" config \
            --file "$CFG_FILE" --datasets "${DATASETS[*]}")" || exit 2
    fi
    eval "${CONFIG_CHECKED[$name]}"  # CFG_MAX_TOKENS CFG_SAVE_INTERVAL CFG_EVAL_BLEU_ARGS
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
