# The driver shared by the reproduce scripts (scripts/reproduce/<paper>_table<N>.sh).
# Source it, do not run it. A reproduce script defines
#
#   TABLE_TITLE="Paper, Table N: what the table reports"
#   TABLE_ROWS=(   # the table's rows, in the paper's order, one entry per system:
#       "<name>|<config>[:<src>-<tgt>]|<extra args>|<paper BLEU>|<baseline row>|<paper params>|<paper speed>"
#   )
#   TABLE_SIGNIFICANCE=paired-bs   # the significance test the paper reports against the
#                                  # baseline row: paired-bs (Koehn 2004's paired
#                                  # bootstrap, full-size resamples), compare-mt, or none
#
# then sources this file and calls `reproduce_main "$@"`.
#
#   name          the row's name: letters, digits, _ . + - (used for --only and as the
#                 run directory WORK/runs/<name>; with --seeds, one run per seed in
#                 WORK/runs/<name>/seed<N>)
#   config        configs/papers/<config>.sh (the paper setting: data, sizes, recipe);
#                 ':<src>-<tgt>' picks one of its PAIRS when it has several
#   extra args    fairseq-train options of this row only, after the config's. A leading
#                 '--arch NAME' trains NAME instead of the config's ARCH (the baselines:
#                 fairseq's transformer of the same size); such a row leaves out the
#                 config's METHOD_ARGS (options the other architecture does not have)
#   paper BLEU    the paper's number (a float, or '-' when the paper has none)
#   baseline row  an earlier row: the reference for parameter differences ('+0.4M'
#                 in the params column) and of the significance tests; empty for none
#   paper params  as the paper prints it (e.g. 88.0M, +0.4M), or empty
#   paper speed   training speed as the paper prints it (steps/s), or empty
#
# Per selected row: prepare the data (once per dataset, variant, direction and
# segmentation; the raw files of each dataset in their own directory), train
# (train.sh with the paper's batch split over the processes; rerunning resumes), average
# the last checkpoints (or take the best one, where the paper early-stops), evaluate,
# and run the significance tests; then print the Markdown table of the paper's numbers
# next to ours (WORK/results.md). With --seeds, every selected row is trained, averaged
# and evaluated once per seed, and the table (fairseq-localness-results, through
# scripts/results.py) shows each row's mean ± standard deviation over the seeds and the
# paired bootstrap against its baseline on the seeds' pooled translations
# (WORK/results.md, with every seed's numbers below it; results.json, results.tsv,
# runs.tsv). Steps whose outputs are up to date are skipped, so a rerun continues where
# the last one stopped. Everything is validated before the first command: a bad option,
# row or configuration stops with exit status 2.
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
. "$(dirname "${BASH_SOURCE[0]}")/../batch_split.sh"
. "$(dirname "${BASH_SOURCE[0]}")/rehearse.sh"

REPRO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# (REPRODUCE_CONFIG_DIR: another directory of configurations; REPRODUCE_PIPELINE_DIR:
# another directory of the pipeline steps prepare_data.sh ... significance.sh. For tests.)
CONFIG_DIR="${REPRODUCE_CONFIG_DIR:-$REPO_DIR/configs/papers}"
PIPELINE_DIR="${REPRODUCE_PIPELINE_DIR:-$SCRIPTS_DIR}"
# The datasets: one manifest each in data/manifests (scripts/prepare_data.sh reads them).
DATASETS=()
for _m in "$REPO_DIR"/data/manifests/*.json; do _m="${_m##*/}"; DATASETS+=("${_m%.json}"); done
unset _m
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

# ------------------------------------------------------------------ configurations
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

# ------------------------------------------------------------------ options
reproduce_parse_args() {
    # the options, checked, as shell assignments (scripts/reproduce/plan.py)
    local script_name assignments HELP=0
    script_name="$(basename "$0" .sh)"
    assignments="$("$PY" "$REPRO_DIR/plan.py" --prog "$PROG" options --datasets "${DATASETS[*]}" \
        --paper-test "${TABLE_SIGNIFICANCE:-none}" -- "$@")" || exit 2
    declare -gA RAW_DIRS=()
    eval "$assignments"
    if (( HELP )); then
        usage; echo; "$PY" "$REPRO_DIR/plan.py" usage; echo; list_rows; exit 0
    fi
    rehearse_options "$script_name"
    WORK="${WORK:-$REPO_DIR/runs/reproduce/$script_name}"
    WORK="${WORK%/}"
    DATA_DIR="${DATA_DIR:-$REPO_DIR/data/prepared}"
    DATA_DIR="${DATA_DIR%/}"
    RAW_ROOT="${RAW_ROOT:-$REPO_DIR/data/downloads}"
    RAW_ROOT="${RAW_ROOT%/}"
    [[ ! -e "$WORK" || -d "$WORK" ]] || die "--work-dir: '$WORK' exists and is not a directory"
    [[ ! -e "$DATA_DIR" || -d "$DATA_DIR" ]] || die "--data-dir: '$DATA_DIR' exists and is not a directory"
}

# raw_dir_of DATASET: where prepare_data.sh finds the dataset's raw files.
raw_dir_of() {
    echo "${RAW_DIRS[$1]:-$RAW_ROOT/$1}"
}

list_rows() {
    printf '%s\n' "${TABLE_ROWS[@]}" | "$PY" "$REPRO_DIR/plan.py" list --title "$TABLE_TITLE"
}

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
        check_reserved "row '$name' (extra args)" "${words[@]}"
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

# ------------------------------------------------------------------ commands
# emit CMD...: --dry-run prints the command (quoted, runnable); otherwise run prints
# it on stderr and runs it.
emit() {
    if (( DRY_RUN )); then
        local quoted
        printf -v quoted ' %q' "$@"
        echo "${quoted# }"
    else
        run "$@"
    fi
}

note() {
    if (( DRY_RUN )); then
        echo "# $*"
    else
        echo "${PROG}: $*" >&2
    fi
}

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
# output, sacreBLEU as the papers' NIST BLEU; validation at each checkpoint).
early_stop_args() {
    local i="$1" detok=space remove=sentencepiece gen prev="" w
    [[ "$BPE" == subword-nmt ]] && detok=moses remove=subword_nmt
    gen="{\"beam\": $BEAM, \"lenpen\": $LENPEN"
    for w in "${GENERATE_ARGS[@]}"; do
        case "$prev" in
            --max-len-a) gen+=", \"max_len_a\": $w" ;;
            --max-len-b) gen+=", \"max_len_b\": $w" ;;
        esac
        prev="$w"
    done
    gen+="}"
    EARLY_ARGS=(--eval-bleu --eval-bleu-args "$gen" --eval-bleu-detok "$detok")
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

run_row() {  # i
    local i="$1" name="${R_NAME[$1]}" run_dir="${R_RUN[$1]}" data="${R_DATA[$1]}"
    local src="${R_SRC[$1]}" tgt="${R_TGT[$1]}"
    load_row "$i"
    note "=== $name: ${R_ARCH[$i]}, ${R_CFG[$i]} (${R_DATASET[$i]}${R_VARIANT[$i]:+ ${R_VARIANT[$i]}} $src-$tgt)$( \
        (( ${#SEEDS[@]} > 1 )) && echo ", seed $SEED") ==="
    if (( ${#SEEDS[@]} > 1 )) && [[ "$run_dir" == "$WORK/runs/$name" ]]; then
        note "$name: seed $SEED: the one-seed run in $run_dir is this seed's run"
    fi
    row_files "$i"
    note "$name: batch: $BATCH_TEXT"
    note "$name: training: $TRAINING_TEXT"

    # data: once per dataset, variant, direction and segmentation
    if [[ ! -f "$data/PREPARED" && " $PREPARED_THIS_RUN " != *" $data "* ]]; then
        prepare_args "$i"
        emit bash "$PIPELINE_DIR/prepare_data.sh" "${PREP_ARGS[@]}"
        PREPARED_THIS_RUN+=" $data"
    fi

    local score="$ROW_SCORE" ckpt="$ROW_CKPT" xscore="$ROW_XSCORE"
    if [[ -f "$score" && "$score" -nt "$run_dir/checkpoint_last.pt" && "$score" -nt "$ckpt" \
          && ( -z "$xscore" || -f "$xscore" ) ]]; then
        note "$name: trained and evaluated ($score)"
    else
        train_and_evaluate "$i"
    fi
    row_significance "$i"
}

# train_and_evaluate i: train row i (with its configuration and row loaded: load_row's
# FAIRSEQ_ARGS and SIGNATURE, row_files' ROW_CKPT), average or take the best checkpoint,
# and translate and score the test set.
train_and_evaluate() {  # i
    local i="$1" name="${R_NAME[$1]}" run_dir="${R_RUN[$1]}" data="${R_DATA[$1]}"
    local src="${R_SRC[$1]}" tgt="${R_TGT[$1]}" kind="${R_KIND[$1]}" xkind="${R_XKIND[$1]}"
    local ckpt="$ROW_CKPT" hw=() prec=() maxtok=() gen_extra=()
    if (( REHEARSE && REHEARSE_PROCS > 1 )); then
        hw=(--gpus "$REHEARSE_PROCS" --cpu) gen_extra=(--cpu)
    elif (( CPU )); then
        hw=(--cpu) gen_extra=(--cpu)
    else
        hw=(--gpus "$GPUS")
    fi
    [[ -n "$PRECISION" ]] && prec=(--precision "$PRECISION")
    [[ -n "$MAX_TOKENS" ]] && maxtok=(--max-tokens "$MAX_TOKENS")
    emit mkdir -p "$run_dir"
    (( DRY_RUN )) || printf '%s\n' "$SIGNATURE" > "$run_dir/SYSTEM"
    emit bash "$PIPELINE_DIR/train.sh" --arch "${R_ARCH[$i]}" --data-bin "$data/bin" --save-dir "$run_dir" \
        --max-update "$MAX_UPDATE" --src "$src" --tgt "$tgt" --seed "$SEED" "${hw[@]}" \
        --effective-tokens "$EFFECTIVE_TOKENS" "${prec[@]}" \
        -- "${FAIRSEQ_ARGS[@]}" "${maxtok[@]}" --log-file "$run_dir/train.log"
    if [[ "${R_TRAINING[$i]}" != early-stop ]] && [[ ! -f "$ckpt" || "$run_dir/checkpoint_last.pt" -nt "$ckpt" ]]; then
        emit bash "$PIPELINE_DIR/average.sh" --save-dir "$run_dir" --last "$AVERAGE_LAST" --by update \
            --output "$ckpt"
    fi
    # sacreBLEU (bleu.json) always; one tokenized BLEU (tok_bleu.json) where the main
    # or the extra column reports it
    local bleu_opts=() k
    for k in "$kind" "$xkind"; do
        case "$k" in
            multi-bleu) bleu_opts=(--tok-bleu) ;;
            tok-compound) bleu_opts=(--tok-bleu --compound-split) ;;
        esac
    done
    local gen=("${GENERATE_ARGS[@]}" "${gen_extra[@]}")
    local tail=()
    (( ${#gen[@]} )) && tail=(-- "${gen[@]}")
    emit bash "$PIPELINE_DIR/evaluate.sh" --data-bin "$data/bin" --checkpoint "$ckpt" --src "$src" --tgt "$tgt" \
        --ref "$data/raw/test.$tgt" --subset test --beam "$BEAM" --lenpen "$LENPEN" --out "$run_dir/eval" \
        "${bleu_opts[@]}" "${tail[@]}"
}

# row_significance i: the significance tests of row i against its baseline row, on the
# main column's BLEU: sacreBLEU's tokenization of the detokenized output, or
# evaluate.sh's tokenized texts as they are (with several seeds, the table's paired
# bootstrap over the seeds instead: seeds_table).
row_significance() {  # i
    local i="$1" name="${R_NAME[$1]}" run_dir="${R_RUN[$1]}" data="${R_DATA[$1]}"
    local tgt="${R_TGT[$1]}" kind="${R_KIND[$1]}" base="${R_BASE[$1]}"
    [[ -n "$RUN_TESTS" && -n "$base" ]] && (( ${#SEEDS[@]} == 1 )) || return 0
    local b j texts=hyp.detok ref="$data/raw/test.$tgt" tok=13a tokenize=()
    if [[ "$kind" == multi-bleu || "$kind" == tok-compound ]]; then
        texts=hyp.tok_bleu ref="$run_dir/eval/ref.tok_bleu" tok=none tokenize=(--tokenize none)
    fi
    for j in "${!R_NAME[@]}"; do [[ "${R_NAME[$j]}" == "$base" ]] && b="$j"; done
    local base_hyp="${R_RUN[$b]}/eval/$texts" hyp="$run_dir/eval/$texts" test out
    if [[ " ${SELECTED[*]} " != *" $b "* && ! -f "$base_hyp" ]]; then
        note "$name: no significance test: the baseline row '$base' is not selected and has no translation yet"
        return 0
    fi
    for test in $RUN_TESTS; do
        if [[ "$test" == compare-mt ]]; then
            out="$run_dir/significance/significance.json"
        else
            out="$run_dir/paired_bs/paired_bs.json"
        fi
        if [[ -f "$out" && "$out" -nt "$hyp" && "$out" -nt "$base_hyp" ]]; then
            note "$name: $test significance test done ($out)"
        elif [[ "$test" == compare-mt ]]; then
            emit bash "$PIPELINE_DIR/significance.sh" --ref "$ref" --baseline "$base=$base_hyp" \
                --system "$name=$hyp" --samples 1000 "${tokenize[@]}" --out "$run_dir/significance"
        else
            emit "$PY" "$REPRO_DIR/paired_bs.py" --ref "$ref" --baseline "$base=$base_hyp" \
                --system "$name=$hyp" --samples 1000 --tokenize "$tok" --out "$run_dir/paired_bs"
        fi
    done
}

# ------------------------------------------------------------------ table
# Print the Markdown table (paper's numbers next to ours, from the result files that
# exist; scripts/reproduce/results_table.py); written to WORK/results.md unless --dry-run.
print_table() {
    local i out="" rows
    printf -v rows '%s\t' name pair paper_bleu kind extra score extra_score sacrebleu paper_params paper_speed \
        log baseline compare_mt paired_bs config paper_metric test training shares_embeddings
    rows="${rows%$'\t'}"$'\n'
    for i in "${!R_NAME[@]}"; do
        load_config "${R_CFG[$i]}"
        row_files "$i"
        local line
        printf -v line '%s\t' "${R_NAME[$i]}" "${R_SRC[$i]}-${R_TGT[$i]}" "${R_BLEU[$i]}" "${R_KIND[$i]}" \
            "${R_XKIND[$i]}" "$ROW_SCORE" "$ROW_XSCORE" \
            "${R_RUN[$i]}/eval/bleu.json" "${R_PARAMS[$i]}" "${R_SPEED[$i]}" "${R_RUN[$i]}/train.log" \
            "${R_BASE[$i]}" "${R_RUN[$i]}/significance/significance.json" "${R_RUN[$i]}/paired_bs/paired_bs.json" \
            "${R_CFG[$i]}" "$PAPER_BLEU" "${R_DATASET[$i]}${R_VARIANT[$i]:+ (${R_VARIANT[$i]})}: ${R_TEST[$i]}" \
            "$TRAINING_TEXT" "${R_SHARES[$i]}"
        rows+="${line%$'\t'}"$'\n'
    done
    (( DRY_RUN )) || { mkdir -p "$WORK"; out="$WORK/results.md"; }
    "$PY" "$REPRO_DIR/results_table.py" --title "$TABLE_TITLE" --tests "$RUN_TESTS" --out "$out" <<< "${rows%$'\n'}"
}

# seeds_table: the table over several seeds, by fairseq-localness-results (layout
# reproduce; scripts/results.py runs it without importing fairseq). Its RUNS.tsv has one
# line per row and seed: the run directory, the files of the main column's BLEU (the
# same texts and tokenization as the one-seed significance tests), the extra column's
# score, and the row's display columns (paper numbers, configuration notes). Written to
# WORK/runs.tsv, and the table with every seed's numbers to WORK/results.md,
# results.json and results.tsv, unless --dry-run (then printed only).
seeds_table() {
    local i seed hyp score ref tokenize xscore dir tsv line
    printf -v tsv '%s\t' system seed dir hyp score ref tokenize baseline extra_score pair metric extra_metric \
        paper_bleu paper_params paper_speed shares_embeddings config paper_metric test training
    tsv="${tsv%$'\t'}"$'\n'
    for i in "${!R_NAME[@]}"; do
        load_config "${R_CFG[$i]}"
        row_files "$i"  # TRAINING_TEXT
        case "${R_KIND[$i]}" in
            multi-bleu|tok-compound)
                hyp=eval/hyp.tok_bleu score=eval/tok_bleu.json ref=eval/ref.tok_bleu tokenize=none ;;
            *)
                hyp=eval/hyp.detok score=eval/bleu.json ref="${R_DATA[$i]}/raw/test.${R_TGT[$i]}" tokenize=13a
                [[ "$ref" == /* ]] || ref="$PWD/$ref" ;;  # (a relative ref is read from the run directory)
        esac
        kind_json "${R_XKIND[$i]}" ""
        xscore="${KIND_JSON#/}"
        for seed in "${SEEDS[@]}"; do
            seed_run_dir "$i" "$seed"
            if (( DRY_RUN )); then  # (read from standard input: absolute paths)
                dir="$RUN_DIR"
                [[ "$dir" == /* ]] || dir="$PWD/$dir"
            else
                dir="${RUN_DIR#"$WORK"/}"  # relative to WORK/runs.tsv
            fi
            printf -v line '%s\t' "${R_NAME[$i]}" "$seed" "$dir" "$hyp" "$score" "$ref" "$tokenize" "${R_BASE[$i]}" \
                "$xscore" "${R_SRC[$i]}-${R_TGT[$i]}" "${R_KIND[$i]}" "${R_XKIND[$i]}" "${R_BLEU[$i]}" \
                "${R_PARAMS[$i]}" "${R_SPEED[$i]}" "${R_SHARES[$i]}" "${R_CFG[$i]}" "$PAPER_BLEU" \
                "${R_DATASET[$i]}${R_VARIANT[$i]:+ (${R_VARIANT[$i]})}: ${R_TEST[$i]}" "$TRAINING_TEXT"
            tsv+="${line%$'\t'}"$'\n'
        done
    done
    local args=(--layout reproduce --title "$TABLE_TITLE" --samples 1000)
    [[ -n "$RUN_TESTS" ]] && args+=(--significance)
    if (( DRY_RUN )); then
        "$PY" "$SCRIPTS_DIR/results.py" "${args[@]}" --runs - <<< "${tsv%$'\n'}"
    else
        mkdir -p "$WORK"
        printf '%s' "$tsv" > "$WORK/runs.tsv"
        "$PY" "$SCRIPTS_DIR/results.py" "${args[@]}" --runs "$WORK/runs.tsv" --out "$WORK"
    fi
}

# the table: over several seeds, or of one run per row
write_table() {
    if (( ${#SEEDS[@]} > 1 )); then
        seeds_table
    else
        print_table
    fi
}

# ------------------------------------------------------------------ main
# preflight: before a real run (not --dry-run, which imports nothing and looks at no
# raw file): the pipeline steps exist, the architectures are registered and every
# dataset still to prepare has its raw files (or can download them).
preflight() {
    local i step
    for step in prepare_data train average evaluate $( [[ " $RUN_TESTS " == *" compare-mt "* ]] && echo significance); do
        require_file "$PIPELINE_DIR/$step.sh" "pipeline step $step"
    done
    local archs=() unknown
    for i in "${SELECTED[@]}"; do archs+=("${R_ARCH[$i]}"); done
    unknown="$("$PY" -c '
import sys
import fairseq_localness  # noqa: F401  (registers our models)
from fairseq.models import ARCH_MODEL_REGISTRY
print(" ".join(sorted({a for a in sys.argv[1:] if a not in ARCH_MODEL_REGISTRY})))
' "${archs[@]}" 2>/dev/null)" || die "importing fairseq_localness failed; run '$PY -c \"import fairseq_localness\"' to see why"
    [[ -z "$unknown" ]] || die "architecture(s) not registered with fairseq: $unknown \
(see the ARCH of the configurations and the rows' --arch)"
    local checked=" " msg
    for i in "${SELECTED[@]}"; do
        [[ -f "${R_DATA[$i]}/PREPARED" || "$checked" == *" ${R_DATA[$i]} "* ]] && continue
        checked+="${R_DATA[$i]} "
        load_config "${R_CFG[$i]}"
        pair_of "${R_PAIR[$i]}"
        prepare_args "$i"
        msg="$(bash "$PIPELINE_DIR/prepare_data.sh" "${PREP_ARGS[@]}" --check 2>&1 >/dev/null)" \
            || die "row '${R_NAME[$i]}': its data cannot be prepared: ${msg#prepare_data.sh: error: }"
    done
}

# announce: what the run does (the rows, the directories, the hardware, the seeds) and
# where each dataset's raw files go, and what --download cannot fetch.
announce() {
    local names=() i seen=" "
    for i in "${SELECTED[@]}"; do names+=("${R_NAME[$i]}"); done
    note "${TABLE_TITLE}"
    note "rows: ${names[*]}"
    note "work dir: $WORK; prepared data: $DATA_DIR; downloads: $RAW_ROOT/<dataset>; $( (( CPU )) && echo "CPU" || echo "$GPUS GPU(s)"); seed$( (( ${#SEEDS[@]} > 1 )) && echo s) ${SEEDS[*]}"
    if (( ${#SEEDS[@]} > 1 )); then
        note "${#SEEDS[@]} seeds: every row once per seed, seed by seed, in $WORK/runs/<row>/seed<N>/; the table: \
mean ± sd over the seeds$( [[ -n "$RUN_TESTS" ]] && echo "; significance: Koehn's paired bootstrap against the \
baseline row on the seeds' pooled translations, seeds resampled too (fairseq-localness-results), in place of \
the per-run ${RUN_TESTS// / and }")"
    fi
    for i in "${SELECTED[@]}"; do
        [[ "$seen" == *" ${R_DATASET[$i]} "* ]] && continue
        seen+="${R_DATASET[$i]} "
        if (( REHEARSE )); then
            note "${R_DATASET[$i]}: small fake raw files in $(raw_dir_of "${R_DATASET[$i]}") (fairseq_localness/data/fakes.py)"
            continue
        fi
        case "${R_DOWNLOAD[$i]}" in
            all) note "${R_DATASET[$i]}: raw files in $(raw_dir_of "${R_DATASET[$i]}")$( (( DOWNLOAD )) && echo "; --download fetches the missing ones" || echo "; --download can fetch them")" ;;
            *) note "${R_DATASET[$i]}: raw files in $(raw_dir_of "${R_DATASET[$i]}"); manual step (--download cannot fetch): ${R_MANUAL[$i]}" ;;
        esac
    done
}

reproduce_main() {
    reproduce_parse_args "$@"
    if (( LIST_ONLY )); then
        list_rows
        return 0
    fi
    reproduce_load_rows
    if (( TABLE_ONLY )); then
        write_table
        echo "(written to $WORK/results.md)" >&2
        return 0
    fi
    local i seed
    for seed in "${SEEDS[@]}"; do
        use_seed "$seed"
        for i in "${SELECTED[@]}"; do
            load_row "$i"  # a run directory trained with other settings, or no batch split, stops us here
        done
    done
    rehearse_fakes
    (( DRY_RUN )) || preflight
    announce
    PREPARED_THIS_RUN=""
    for seed in "${SEEDS[@]}"; do  # seed by seed: a partial run has every row of the first seeds
        use_seed "$seed"
        (( ${#SEEDS[@]} == 1 )) || note "--- seed $seed"
        for i in "${SELECTED[@]}"; do
            run_row "$i"
        done
    done
    (( DRY_RUN )) && echo "# table (from the results that exist now):"
    write_table
}
