# The driver shared by the reproduce scripts (scripts/reproduce/<paper>_table<N>.sh).
# Source it, do not run it. A reproduce script defines
#
#   TABLE_TITLE="Paper, Table N: what the table reports"
#   TABLE_ROWS=(   # the table's rows, in the paper's order, one entry per system:
#       "<name>|<config>[:<src>-<tgt>]|<extra args>|<paper BLEU>|<baseline row>|<paper params>|<paper speed>"
#   )
#   TABLE_SIGNIFICANCE=1   # paired bootstrap against the baseline row (the paper reports it)
#
# then sources this file and calls `reproduce_main "$@"`.
#
#   name          the row's name: letters, digits, _ . + - (used for --only and as the
#                 run directory WORK/runs/<name>)
#   config        configs/papers/<config>.sh (the paper setting: data, sizes, recipe);
#                 ':<src>-<tgt>' picks one of its PAIRS when it has several
#   extra args    fairseq-train options of this row only, after the config's. A leading
#                 '--arch NAME' trains NAME instead of the config's ARCH (the baselines:
#                 fairseq's transformer of the same size); such a row leaves out the
#                 config's METHOD_ARGS (options the other architecture does not have)
#   paper BLEU    the paper's number (a float, or '-' when the paper has none)
#   baseline row  an earlier row: the reference for parameter differences ('+0.4M'
#                 in the params column) and, with TABLE_SIGNIFICANCE=1, the baseline
#                 of the significance test; empty for none
#   paper params  as the paper prints it (e.g. 88.0M, +0.4M), or empty
#   paper speed   training speed as the paper prints it (steps/s), or empty
#
# Per selected row: prepare the data (once per dataset, direction and segmentation),
# train (train.sh; rerunning resumes), average the last checkpoints, evaluate, and run
# the significance test; then print the Markdown table of the paper's numbers next to
# ours (WORK/results.md). Steps whose outputs are up to date are skipped, so a rerun
# continues where the last one stopped. Everything is validated before the first
# command: a bad option, row or configuration stops with exit status 2.
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

# (REPRODUCE_CONFIG_DIR: another directory of configurations; REPRODUCE_PIPELINE_DIR:
# another directory of the pipeline steps prepare_data.sh ... significance.sh. For tests.)
CONFIG_DIR="${REPRODUCE_CONFIG_DIR:-$REPO_DIR/configs/papers}"
PIPELINE_DIR="${REPRODUCE_PIPELINE_DIR:-$SCRIPTS_DIR}"
# The datasets scripts/prepare_data.sh knows.
DATASETS=(wmt14_en_de iwslt14_de_en iwslt14_es_en iwslt14_ro_en iwslt15_en_vi iwslt15_fr_en wat17_ja_en wmt17_zh_en)
BLEU_KINDS=(sacrebleu tok tok-compound)
# What a configuration file defines (reset before each one is read).
CONFIG_VARS=(DESCRIPTION PAIRS BPE ARCH MODEL_ARGS METHOD_ARGS TRAIN_ARGS MAX_UPDATE
             EFFECTIVE_TOKENS AVERAGE_LAST BEAM LENPEN GENERATE_ARGS)
# Options the driver and train.sh set themselves; a configuration or row must not.
RESERVED_OPTS=(--max-update --update-freq --seed --save-dir --arch --cpu --log-file
               --source-lang --target-lang --user-dir --task --fp16 --bf16)

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

# opt_value OPTION WORD...: the value following OPTION in the words (last one wins).
opt_value() {
    local opt="$1" value="" prev=""
    shift
    local w
    for w in "$@"; do
        [[ "$prev" == "$opt" ]] && value="$w"
        prev="$w"
    done
    echo "$value"
}

# check_reserved WHERE WORD...: none of the words is an option the driver owns.
check_reserved() {
    local where="$1" w r
    shift
    for w in "$@"; do
        for r in "${RESERVED_OPTS[@]}"; do
            [[ "$w" == "$r" ]] && die "$where: '$r' is set by the reproduce driver and train.sh \
(--max-update from MAX_UPDATE, --update-freq from EFFECTIVE_TOKENS, --seed/--cpu/--precision \
from the command line, the architecture from ARCH or a row's leading --arch); remove it"
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
    # shellcheck disable=SC1090
    . "$CFG_FILE"
    local v
    for v in "${CONFIG_VARS[@]}"; do
        declare -p "$v" &>/dev/null || cfg_die "$v is not set (every configuration sets: ${CONFIG_VARS[*]})"
    done
    require_choice "$CFG_FILE: BPE" "$BPE" subword-nmt sentencepiece
    [[ -n "$ARCH" ]] || cfg_die "ARCH is empty"
    require_int "$CFG_FILE: MAX_UPDATE" "$MAX_UPDATE" 1
    require_int "$CFG_FILE: EFFECTIVE_TOKENS" "$EFFECTIVE_TOKENS" 1
    require_int "$CFG_FILE: AVERAGE_LAST" "$AVERAGE_LAST" 1
    require_int "$CFG_FILE: BEAM" "$BEAM" 1
    require_float "$CFG_FILE: LENPEN" "$LENPEN"
    (( ${#PAIRS[@]} )) || cfg_die "PAIRS is empty; expected entries 'dataset|src|tgt|bpe size|bleu kind'"
    local entry dataset src tgt size kind keys=" "
    for entry in "${PAIRS[@]}"; do
        IFS='|' read -r dataset src tgt size kind <<< "$entry"
        require_choice "$CFG_FILE: PAIRS entry '$entry': dataset" "$dataset" "${DATASETS[@]}"
        require_lang "$CFG_FILE: PAIRS entry '$entry': source language" "$src"
        require_lang "$CFG_FILE: PAIRS entry '$entry': target language" "$tgt"
        require_int "$CFG_FILE: PAIRS entry '$entry': bpe size" "$size" 1
        require_choice "$CFG_FILE: PAIRS entry '$entry': bleu kind" "$kind" "${BLEU_KINDS[@]}"
        [[ "$keys" != *" $src-$tgt "* ]] || cfg_die "PAIRS lists the direction $src-$tgt twice"
        keys+="$src-$tgt "
    done
    check_reserved "$CFG_FILE: MODEL_ARGS" "${MODEL_ARGS[@]}"
    check_reserved "$CFG_FILE: METHOD_ARGS" "${METHOD_ARGS[@]}"
    check_reserved "$CFG_FILE: TRAIN_ARGS" "${TRAIN_ARGS[@]}"
    local mt siu kiu
    mt="$(opt_value --max-tokens "${TRAIN_ARGS[@]}")"
    siu="$(opt_value --save-interval-updates "${TRAIN_ARGS[@]}")"
    kiu="$(opt_value --keep-interval-updates "${TRAIN_ARGS[@]}")"
    [[ -n "$mt" ]] || cfg_die "TRAIN_ARGS has no --max-tokens (the batch per GPU; EFFECTIVE_TOKENS sets --update-freq from it)"
    [[ -n "$siu" ]] || cfg_die "TRAIN_ARGS has no --save-interval-updates (the last AVERAGE_LAST update checkpoints are averaged)"
    require_int "$CFG_FILE: --keep-interval-updates in TRAIN_ARGS" "${kiu:-0}" "$AVERAGE_LAST"
}

# pair_of SPEC: sets P_DATASET P_SRC P_TGT P_BPE_SIZE P_KIND from the loaded
# configuration's PAIRS: SPEC is 'src-tgt', or empty when there is one pair.
pair_of() {
    local want="$1" entry dataset src tgt size kind found="" keys=()
    for entry in "${PAIRS[@]}"; do
        IFS='|' read -r dataset src tgt size kind <<< "$entry"
        keys+=("$src-$tgt")
        if [[ -z "$want" || "$want" == "$src-$tgt" ]]; then
            [[ -z "$found" ]] || return 2
            found=1 P_DATASET="$dataset" P_SRC="$src" P_TGT="$tgt" P_BPE_SIZE="$size" P_KIND="$kind"
        fi
    done
    [[ -n "$found" ]] || { PAIR_KEYS="${keys[*]}"; return 1; }
}

# ------------------------------------------------------------------ options
reproduce_usage_common() {
    cat <<'EOF'
Options (every reproduce script):
  --dry-run          print every command (one per line, runnable) and the table, run
                     nothing, write nothing
  --table            only print the table from the results that exist (and write
                     WORK/results.md)
  --work-dir DIR     where runs and results go (default: runs/reproduce/<script name>)
  --data-dir DIR     prepared corpora (default: WORK/data); give several tables the
                     same one to prepare each corpus once
  --raw-dir DIR      local copies of the downloads, passed to prepare_data.sh
                     (default: DATA/downloads)
  --only "A B"       only these rows (names from the table below)
  --gpus N           GPUs per run (default 1); the paper's batch is kept through
                     --update-freq (train.sh --effective-tokens)
  --cpu              train and translate on the CPU (smoke runs)
  --max-tokens N     batch per GPU, replacing the configuration's (the effective batch
                     stays the paper's)
  --precision P      auto (default of train.sh), fp32, fp16 or bf16
  --seed N           training seed (default 1)
  --seeds A,B,...    train every row once per seed, in WORK/runs/<row>/seed<N>/; the
                     table (fairseq-localness-results) shows the mean ± standard
                     deviation over the seeds, and with significance a paired bootstrap
                     of each row against its baseline on the seeds' pooled translations
                     (and how many seeds pass the same test on their own)
  --list             print the rows and exit
EOF
}

reproduce_parse_args() {
    DRY_RUN=0 TABLE_ONLY=0 LIST_ONLY=0 WORK="" DATA_DIR="" RAW_DIR="" ONLY="" GPUS=1 CPU=0
    MAX_TOKENS="" PRECISION="" SEED=1 SEEDS_SPEC="" SEED_GIVEN=0
    local script_name
    script_name="$(basename "$0" .sh)"
    while (( $# )); do
        case "$1" in
            --dry-run) DRY_RUN=1; shift ;;
            --table) TABLE_ONLY=1; shift ;;
            --list) LIST_ONLY=1; shift ;;
            --work-dir) need_value "$1" $#; WORK="$2"; shift 2 ;;
            --data-dir) need_value "$1" $#; DATA_DIR="$2"; shift 2 ;;
            --raw-dir) need_value "$1" $#; RAW_DIR="$2"; shift 2 ;;
            --only) need_value "$1" $#; ONLY="$2"; shift 2 ;;
            --gpus) need_value "$1" $#; GPUS="$2"; shift 2 ;;
            --cpu) CPU=1; shift ;;
            --max-tokens) need_value "$1" $#; MAX_TOKENS="$2"; shift 2 ;;
            --precision) need_value "$1" $#; PRECISION="$2"; shift 2 ;;
            --seed) need_value "$1" $#; SEED="$2"; SEED_GIVEN=1; shift 2 ;;
            --seeds) need_value "$1" $#; SEEDS_SPEC="$2"; shift 2 ;;
            -h|--help) usage; echo; reproduce_usage_common; echo; list_rows; exit 0 ;;
            *) die "unknown option '$1' (see '${PROG} --help')" ;;
        esac
    done
    (( DRY_RUN + TABLE_ONLY <= 1 )) || die "--dry-run and --table: expected one of them, not both"
    require_int --gpus "$GPUS" 1
    require_int --seed "$SEED" 0
    SEEDS=("$((10#$SEED))")
    if [[ -n "$SEEDS_SPEC" ]]; then
        (( ! SEED_GIVEN )) || die "--seed and --seeds: expected one of them, not both"
        [[ "$SEEDS_SPEC" =~ ^[0-9]+(,[0-9]+)*$ ]] \
            || die "--seeds: expected a comma-separated list of seeds (whole numbers, e.g. 1,2,3), got '$SEEDS_SPEC'"
        IFS=, read -r -a SEEDS <<< "$SEEDS_SPEC"
        local k
        for k in "${!SEEDS[@]}"; do SEEDS[$k]=$((10#${SEEDS[$k]})); done
        [[ "$(printf '%s\n' "${SEEDS[@]}" | sort -u | wc -l)" == "${#SEEDS[@]}" ]] \
            || die "--seeds: '$SEEDS_SPEC' names a seed twice; expected distinct seeds"
        SEED="${SEEDS[0]}"
    fi
    [[ -z "$MAX_TOKENS" ]] || require_int --max-tokens "$MAX_TOKENS" 1
    [[ -z "$PRECISION" ]] || require_choice --precision "$PRECISION" auto fp32 fp16 bf16
    (( CPU == 0 || GPUS == 1 )) || die "--cpu and --gpus $GPUS: expected one of them, not both"
    WORK="${WORK:-$REPO_DIR/runs/reproduce/$script_name}"
    WORK="${WORK%/}"
    DATA_DIR="${DATA_DIR:-$WORK/data}"
    DATA_DIR="${DATA_DIR%/}"
    RAW_DIR="${RAW_DIR:-$DATA_DIR/downloads}"
    [[ ! -e "$WORK" || -d "$WORK" ]] || die "--work-dir: '$WORK' exists and is not a directory"
    [[ ! -e "$DATA_DIR" || -d "$DATA_DIR" ]] || die "--data-dir: '$DATA_DIR' exists and is not a directory"
}

list_rows() {
    echo "Rows of ${TABLE_TITLE}:"
    local entry
    for entry in "${TABLE_ROWS[@]}"; do
        IFS='|' read -r name cfg extra bleu _ <<< "$entry"
        printf '  %-34s %-32s paper BLEU %-6s %s\n' "$name" "$cfg" "$bleu" "$extra"
    done
}

# ------------------------------------------------------------------ rows
# Parse and check every row (not only the selected ones), loading its configuration.
reproduce_load_rows() {
    R_NAME=() R_CFG=() R_PAIR=() R_EXTRA=() R_BLEU=() R_BASE=() R_PARAMS=() R_SPEED=()
    R_ARCH=() R_KIND=() R_DATA=() R_SRC=() R_TGT=() R_RUN=()
    (( ${#TABLE_ROWS[@]} )) || die "TABLE_ROWS is empty"
    local entry name cfgspec extra bleu base params speed more cfg pair i
    for entry in "${TABLE_ROWS[@]}"; do
        IFS='|' read -r name cfgspec extra bleu base params speed more <<< "$entry"
        [[ -z "$more" ]] || die "row '$entry': expected 7 fields 'name|config|extra args|paper BLEU|baseline|params|speed'"
        [[ "$name" =~ ^[A-Za-z0-9_.+-]+$ ]] || die "row '$entry': name '$name': expected letters, digits, _ . + -"
        [[ " ${R_NAME[*]} " != *" $name "* ]] || die "row name '$name' appears twice"
        [[ "$bleu" == "-" ]] || require_float "row '$name': paper BLEU" "$bleu"
        if [[ -n "$base" ]]; then
            [[ " ${R_NAME[*]} " == *" $base "* ]] || die "row '$name': baseline '$base' is not an earlier row"
        fi
        cfg="${cfgspec%%:*}" pair=""
        [[ "$cfgspec" == *:* ]] && pair="${cfgspec#*:}"
        load_config "$cfg"
        pair_of "$pair" || case $? in
            1) die "row '$name': configuration $cfg has no direction '$pair'; its directions: $PAIR_KEYS" ;;
            *) die "row '$name': configuration $cfg has several directions; name one as '$cfg:<src>-<tgt>'" ;;
        esac
        local words=() arch="$ARCH"
        read -r -a words <<< "$extra"
        if [[ "${words[0]:-}" == --arch ]]; then
            [[ -n "${words[1]:-}" ]] || die "row '$name': '--arch' needs an architecture name"
            arch="${words[1]}"
            words=("${words[@]:2}")
        fi
        check_reserved "row '$name' (extra args)" "${words[@]}"
        R_NAME+=("$name") R_CFG+=("$cfg") R_PAIR+=("$pair") R_EXTRA+=("${words[*]}")
        R_BLEU+=("$bleu") R_BASE+=("$base") R_PARAMS+=("$params") R_SPEED+=("$speed")
        R_ARCH+=("$arch") R_KIND+=("$P_KIND") R_SRC+=("$P_SRC") R_TGT+=("$P_TGT")
        R_DATA+=("$DATA_DIR/$P_DATASET.$P_SRC-$P_TGT.$BPE$P_BPE_SIZE")
        R_RUN+=("$WORK/runs/$name")
    done
    # --only
    SELECTED=()
    if [[ -n "$ONLY" ]]; then
        local want
        for want in $ONLY; do
            [[ " ${R_NAME[*]} " == *" $want "* ]] || die "--only: no row '$want' in ${TABLE_TITLE%%:*}; expected some of: ${R_NAME[*]}"
        done
        for i in "${!R_NAME[@]}"; do
            [[ " $ONLY " == *" ${R_NAME[$i]} "* ]] && SELECTED+=("$i")
        done
    else
        SELECTED=("${!R_NAME[@]}")
    fi
    return 0
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

# The result files of row i.
score_json() {  # i
    case "${R_KIND[$1]}" in
        sacrebleu) echo "${R_RUN[$1]}/eval/bleu.json" ;;
        *) echo "${R_RUN[$1]}/eval/tok_bleu.json" ;;
    esac
}
avg_ckpt() {  # i (uses the loaded configuration's AVERAGE_LAST)
    echo "${R_RUN[$1]}/checkpoint_avg_last${AVERAGE_LAST}.pt"
}

# What makes a run what it is; a run directory trained with another one is refused.
system_signature() {  # i words...
    local i="$1"
    shift
    printf '%s\n' "arch ${R_ARCH[$i]}" "data $(basename "${R_DATA[$i]}")" "pair ${R_SRC[$i]}-${R_TGT[$i]}" \
        "max-update $MAX_UPDATE" "effective-tokens $EFFECTIVE_TOKENS" "seed $SEED" "args $*"
}

# load_row i: load row i's configuration and direction; sets FAIRSEQ_ARGS (the
# fairseq-train options: the configuration's, the method's unless the row trains
# another architecture, then the row's) and SIGNATURE; stops if the row's run
# directory was trained with other settings.
load_row() {  # i
    local i="$1" run_dir="${R_RUN[$1]}"
    load_config "${R_CFG[$i]}"
    pair_of "${R_PAIR[$i]}"
    local extra=() method=()
    read -r -a extra <<< "${R_EXTRA[$i]}"
    [[ "${R_ARCH[$i]}" == "$ARCH" ]] && method=("${METHOD_ARGS[@]}")
    FAIRSEQ_ARGS=("${MODEL_ARGS[@]}" "${TRAIN_ARGS[@]}" "${method[@]}" "${extra[@]}")
    SIGNATURE="$(system_signature "$i" "${FAIRSEQ_ARGS[@]}")"
    if [[ -f "$run_dir/SYSTEM" ]] && [[ "$(cat "$run_dir/SYSTEM")" != "$SIGNATURE" ]]; then
        die "row '${R_NAME[$i]}': $run_dir was trained with other settings (see $run_dir/SYSTEM); \
use another --work-dir, or remove that directory to train again"
    fi
}

run_row() {  # i
    local i="$1" name="${R_NAME[$1]}" run_dir="${R_RUN[$1]}" data="${R_DATA[$1]}"
    local src="${R_SRC[$1]}" tgt="${R_TGT[$1]}" kind="${R_KIND[$1]}"
    load_row "$i"
    local fairseq_args=("${FAIRSEQ_ARGS[@]}") signature="$SIGNATURE"
    note "=== $name: ${R_ARCH[$i]}, ${R_CFG[$i]} ($P_DATASET $src-$tgt) ==="

    # data: once per dataset, direction and segmentation
    if [[ ! -f "$data/PREPARED" && " $PREPARED_THIS_RUN " != *" $data "* ]]; then
        emit bash "$PIPELINE_DIR/prepare_data.sh" --dataset "$P_DATASET" --raw-dir "$RAW_DIR" --out "$data" \
            --src "$src" --tgt "$tgt" --bpe "$BPE" --bpe-size "$P_BPE_SIZE"
        PREPARED_THIS_RUN+=" $data"
    fi

    local score avg hw=() prec=() maxtok=() gen_extra=()
    score="$(score_json "$i")"
    avg="$(avg_ckpt "$i")"
    if (( CPU )); then
        hw=(--cpu) gen_extra=(--cpu)
    else
        hw=(--gpus "$GPUS")
    fi
    [[ -n "$PRECISION" ]] && prec=(--precision "$PRECISION")
    [[ -n "$MAX_TOKENS" ]] && maxtok=(--max-tokens "$MAX_TOKENS")
    if [[ -f "$score" && "$score" -nt "$run_dir/checkpoint_last.pt" && "$score" -nt "$avg" ]]; then
        note "$name: trained and evaluated ($score)"
    else
        emit mkdir -p "$run_dir"
        (( DRY_RUN )) || printf '%s\n' "$signature" > "$run_dir/SYSTEM"
        emit bash "$PIPELINE_DIR/train.sh" --arch "${R_ARCH[$i]}" --data-bin "$data/bin" --save-dir "$run_dir" \
            --max-update "$MAX_UPDATE" --src "$src" --tgt "$tgt" --seed "$SEED" "${hw[@]}" \
            --effective-tokens "$EFFECTIVE_TOKENS" "${prec[@]}" \
            -- "${fairseq_args[@]}" "${maxtok[@]}" --log-file "$run_dir/train.log"
        if [[ ! -f "$avg" || "$run_dir/checkpoint_last.pt" -nt "$avg" ]]; then
            emit bash "$PIPELINE_DIR/average.sh" --save-dir "$run_dir" --last "$AVERAGE_LAST" --by update \
                --output "$avg"
        fi
        local bleu_opts=()
        case "$kind" in
            tok) bleu_opts=(--tok-bleu) ;;
            tok-compound) bleu_opts=(--tok-bleu --compound-split) ;;
        esac
        local gen=("${GENERATE_ARGS[@]}" "${gen_extra[@]}")
        local tail=()
        (( ${#gen[@]} )) && tail=(-- "${gen[@]}")
        emit bash "$PIPELINE_DIR/evaluate.sh" --data-bin "$data/bin" --checkpoint "$avg" --src "$src" --tgt "$tgt" \
            --ref "$data/raw/test.$tgt" --subset test --beam "$BEAM" --lenpen "$LENPEN" --out "$run_dir/eval" \
            "${bleu_opts[@]}" "${tail[@]}"
    fi

    # significance against the baseline row, on the BLEU the table reports: sacreBLEU's
    # tokenization of the detokenized output, or evaluate.sh's tokenized texts as they are
    local base="${R_BASE[$i]}"
    if (( ${TABLE_SIGNIFICANCE:-0} )) && [[ -n "$base" ]]; then
        local b j sig="$run_dir/significance/significance.json" texts=hyp.detok ref="$data/raw/test.$tgt"
        local tokenize=()
        if [[ "$kind" != sacrebleu ]]; then
            texts=hyp.tok_bleu ref="$run_dir/eval/ref.tok_bleu" tokenize=(--tokenize none)
        fi
        for j in "${!R_NAME[@]}"; do [[ "${R_NAME[$j]}" == "$base" ]] && b="$j"; done
        local base_hyp="${R_RUN[$b]}/eval/$texts" hyp="$run_dir/eval/$texts"
        if [[ " ${SELECTED[*]} " != *" $b "* && ! -f "$base_hyp" ]]; then
            note "$name: no significance test: the baseline row '$base' is not selected and has no translation yet"
        elif [[ -f "$sig" && "$sig" -nt "$hyp" && "$sig" -nt "$base_hyp" ]]; then
            note "$name: significance test done ($sig)"
        else
            emit bash "$PIPELINE_DIR/significance.sh" --ref "$ref" --baseline "$base=$base_hyp" \
                --system "$name=$hyp" --samples 1000 "${tokenize[@]}" --out "$run_dir/significance"
        fi
    fi
}

# ------------------------------------------------------------------ table
# Print the Markdown table (paper's numbers next to ours, from the result files that
# exist); written to WORK/results.md unless --dry-run.
print_table() {
    local rows=() i
    for i in "${!R_NAME[@]}"; do
        rows+=("$(printf '%s\t' "${R_NAME[$i]}" "${R_BLEU[$i]}" "${R_KIND[$i]}" "$(score_json "$i")" \
            "${R_RUN[$i]}/eval/bleu.json" "${R_PARAMS[$i]}" "${R_SPEED[$i]}" "${R_RUN[$i]}/train.log" \
            "${R_BASE[$i]}" "${R_RUN[$i]}/significance/significance.json" "${R_SRC[$i]}-${R_TGT[$i]}")")
    done
    local out=""
    (( DRY_RUN )) || { mkdir -p "$WORK"; out="$WORK/results.md"; }
    "$PY" - "$TABLE_TITLE" "${TABLE_SIGNIFICANCE:-0}" "$out" "${rows[@]}" <<'EOF'
import json, os, re, sys

title, with_sig, out = sys.argv[1:4]
rows = [r.split("\t")[:11] for r in sys.argv[4:]]
KIND = {"sacrebleu": "sacreBLEU", "tok": "tok. BLEU", "tok-compound": "tok. BLEU, compound split"}


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def params_of(log):
    try:
        text = open(log, errors="replace").read()
    except OSError:
        return None
    m = re.findall(r"num\. shared model params: ([0-9,]+)", text)
    return int(m[-1].replace(",", "")) if m else None


UPS = re.compile(r'\b(?:train_)?ups"?[ =:]+"?([0-9.]+)')  # simple (ups 2.5, ups=2.5) and json ("train_ups": "2.5")


def speed_of(log):
    """Updates per second, mean over the epoch summaries (train_inner if none)."""
    try:
        lines = open(log, errors="replace").read().splitlines()
    except OSError:
        return None
    ups = [float(m.group(1)) for l in lines if "| train |" in l for m in [UPS.search(l)] if m]
    if not ups:
        ups = [float(m.group(1)) for l in lines if "train_inner" in l for m in [UPS.search(l)] if m]
    return sum(ups) / len(ups) if ups else None


def p_value(obj, name=None):
    """The p-value of `name` against the baseline in significance.json (its
    "comparisons"), else the first p-value found in it."""
    if isinstance(obj, dict) and name is not None:
        for c in obj.get("comparisons") or []:
            if isinstance(c, dict) and c.get("system") == name and isinstance(c.get("p_value"), (int, float)):
                return c["p_value"]
    if isinstance(obj, dict):
        for k, v in obj.items():
            if re.fullmatch(r"p(_?value)?", k, re.I) and isinstance(v, (int, float)):
                return v
        for v in obj.values():
            p = p_value(v)
            if p is not None:
                return p
    elif isinstance(obj, list):
        for v in obj:
            p = p_value(v)
            if p is not None:
                return p
    return None


def millions(n):
    return "%.2fM" % (n / 1e6) if abs(n) >= 1e5 else "{:,}".format(n)


has_params = any(r[5] for r in rows)
has_speed = any(r[6] for r in rows)
has_sig = with_sig == "1" and any(r[8] for r in rows)
ours_params = {r[0]: params_of(r[7]) for r in rows}
head = ["row", "pair", "metric", "paper BLEU", "our BLEU", "delta"]
if has_params:
    head += ["paper params", "our params"]
if has_speed:
    head += ["paper speed", "our speed"]
if has_sig:
    head += ["p (vs. baseline)"]
lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" if i < 3 else "---:" for i in range(len(head))) + "|"]
signatures = set()
done = 0
for name, paper, kind, score_path, sacre_path, pparams, pspeed, log, base, sig_path, pair in rows:
    score = load(score_path)
    ours = "%.2f" % score["score"] if score and "score" in score else "-"
    sacre = load(sacre_path)
    if sacre and "signature" in sacre:
        signatures.add(sacre["signature"])
    delta = "-"
    if ours != "-":
        done += 1
        if paper != "-":
            delta = "%+.2f" % (float(ours) - float(paper))
    cells = [name, pair, KIND[kind], paper, ours, delta]
    if has_params:
        n = ours_params.get(name)
        if n is None:
            mine = "-"
        elif pparams.startswith("+") and base and ours_params.get(base) is not None:
            mine = "+" + millions(n - ours_params[base]) if n >= ours_params[base] else "-" + millions(ours_params[base] - n)
        else:
            mine = millions(n)
        cells += [pparams or "-", mine]
    if has_speed:
        s = speed_of(log)
        cells += [pspeed or "-", "%.2f" % s if s is not None else "-"]
    if has_sig:
        p = p_value(load(sig_path), name) if base else None
        cells += ["%.3f" % p if p is not None else "-"]
    lines.append("| " + " | ".join(cells) + " |")
notes = [
    "",
    "%s. Our numbers: %d of %d rows have results ('-': not run yet). delta = ours - paper."
    % (title, done, len(rows)),
]
if has_speed:
    notes.append("Speed: training updates per second (the paper's on its hardware; ours as "
                 "trained here, mean of fairseq's 'ups' per epoch).")
if has_sig:
    notes.append("p: paired bootstrap resampling against the row's baseline (significance.sh, "
                 "1000 samples).")
if any(r[5].startswith("+") for r in rows):
    notes.append("Params: for rows whose paper number starts with '+', ours is the difference "
                 "from the row's baseline too.")
for s in sorted(signatures):
    notes.append("sacreBLEU signature: " + s)
text = "\n".join(lines + notes) + "\n"
print(text, end="")
if out:
    with open(out, "w") as f:
        f.write(text)
EOF
}

# ------------------------------------------------------------------ several seeds
# --seeds A,B,...: every selected row once per seed, each seed's run in
# WORK/runs/<row>/seed<N>/ with the steps of one seed (significance.sh against the
# baseline's run with the same seed); then the table of all seeds.
use_seed() {  # N: the rows' run directories (and --seed) of seed N
    local i
    SEED="$1"
    for i in "${!R_NAME[@]}"; do R_RUN[$i]="$WORK/runs/${R_NAME[$i]}/seed$SEED"; done
}

# The table over the seeds (fairseq-localness-results, layout reproduce): every row's
# runs with the files its BLEU comes from; written to WORK/results.{md,json,tsv} unless
# --dry-run.
seeds_table() {
    local i seed hyp score ref tokenize out=()
    (( DRY_RUN )) || out=(--out "$WORK")
    {
        printf '%s\t' system seed dir hyp score ref tokenize baseline pair metric paper_bleu paper_params
        printf 'paper_speed\n'
        for i in "${!R_NAME[@]}"; do
            hyp=eval/hyp.detok score=eval/bleu.json ref="${R_DATA[$i]}/raw/test.${R_TGT[$i]}" tokenize=13a
            [[ "$ref" == /* ]] || ref="$PWD/$ref"  # (a relative ref would be read from the run directory)
            if [[ "${R_KIND[$i]}" != sacrebleu ]]; then
                hyp=eval/hyp.tok_bleu score=eval/tok_bleu.json ref=eval/ref.tok_bleu tokenize=none
            fi
            for seed in "${SEEDS[@]}"; do
                printf '%s\t' "${R_NAME[$i]}" "$seed" "$WORK/runs/${R_NAME[$i]}/seed$seed" "$hyp" "$score" "$ref" \
                    "$tokenize" "${R_BASE[$i]}" "${R_SRC[$i]}-${R_TGT[$i]}" "${R_KIND[$i]}" "${R_BLEU[$i]}" \
                    "${R_PARAMS[$i]}"
                printf '%s\n' "${R_SPEED[$i]}"
            done
        done
    } | "$PY" -m fairseq_localness.cli.results --layout reproduce --runs - --title "$TABLE_TITLE" \
        $( (( ${TABLE_SIGNIFICANCE:-0} )) && echo --significance ) "${out[@]}"
}

run_seeds() {
    local seed i names=()
    for seed in "${SEEDS[@]}"; do  # a run directory trained with other settings stops us here
        use_seed "$seed"
        for i in "${SELECTED[@]}"; do load_row "$i"; done
    done
    for i in "${SELECTED[@]}"; do names+=("${R_NAME[$i]}"); done
    note "${TABLE_TITLE}"
    note "rows: ${names[*]}; seeds: ${SEEDS[*]}"
    note "work dir: $WORK; data: $DATA_DIR; downloads: $RAW_DIR; $( (( CPU )) && echo "CPU" || echo "$GPUS GPU(s)")"
    PREPARED_THIS_RUN=""
    for seed in "${SEEDS[@]}"; do
        use_seed "$seed"
        note "--- seed $seed"
        for i in "${SELECTED[@]}"; do
            run_row "$i"
        done
    done
    (( DRY_RUN )) && echo "# table (from the results that exist now):"
    seeds_table
}

# ------------------------------------------------------------------ main
reproduce_main() {
    reproduce_parse_args "$@"
    if (( LIST_ONLY )); then
        list_rows
        return 0
    fi
    reproduce_load_rows
    if (( TABLE_ONLY )); then
        if (( ${#SEEDS[@]} > 1 )); then seeds_table; else print_table; fi
        echo "(written to $WORK/results.md)" >&2
        return 0
    fi
    # the pipeline steps exist and the architectures are registered (train.sh checks
    # them again; skipped by --dry-run, which imports nothing)
    if (( ! DRY_RUN )); then
        local step
        for step in prepare_data train average evaluate $( (( ${TABLE_SIGNIFICANCE:-0} )) && echo significance); do
            require_file "$PIPELINE_DIR/$step.sh" "pipeline step $step"
        done
        local archs=() i unknown
        for i in "${SELECTED[@]}"; do archs+=("${R_ARCH[$i]}"); done
        unknown="$("$PY" -c '
import sys
import fairseq_localness  # noqa: F401  (registers our models)
from fairseq.models import ARCH_MODEL_REGISTRY
print(" ".join(sorted({a for a in sys.argv[1:] if a not in ARCH_MODEL_REGISTRY})))
' "${archs[@]}" 2>/dev/null)" || die "importing fairseq_localness failed; run '$PY -c \"import fairseq_localness\"' to see why"
        [[ -z "$unknown" ]] || die "architecture(s) not registered with fairseq: $unknown \
(see the ARCH of the configurations and the rows' --arch)"
    fi
    if (( ${#SEEDS[@]} > 1 )); then
        run_seeds
        return
    fi
    local names=() i
    for i in "${SELECTED[@]}"; do
        names+=("${R_NAME[$i]}")
        load_row "$i"  # a run directory trained with other settings stops us here
    done
    note "${TABLE_TITLE}"
    note "rows: ${names[*]}"
    note "work dir: $WORK; data: $DATA_DIR; downloads: $RAW_DIR; $( (( CPU )) && echo "CPU" || echo "$GPUS GPU(s)"); seed $SEED"
    PREPARED_THIS_RUN=""
    for i in "${SELECTED[@]}"; do
        run_row "$i"
    done
    (( DRY_RUN )) && echo "# table (from the results that exist now):"
    print_table
}
