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
#
# The parts: this file (the options, the order of the steps, what the run prints),
# config.sh (the configurations), rows.sh (the rows, their data, run directories and
# fairseq options), steps.sh (the commands of a row, the table), rehearse.sh
# (--rehearse); what is computed from the options and the rows and printed from them
# is plan.py's (checked options and configurations, checked and selected rows, --list;
# unit tests in tests/test_reproduce_plan.py), the table results_table.py's; options.txt
# is the --help of the options every script takes.
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
. "$(dirname "${BASH_SOURCE[0]}")/../batch_split.sh"
. "$(dirname "${BASH_SOURCE[0]}")/rehearse.sh"
. "$(dirname "${BASH_SOURCE[0]}")/slurm.sh"

REPRO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# (REPRODUCE_CONFIG_DIR: another directory of configurations; REPRODUCE_PIPELINE_DIR:
# another directory of the pipeline steps prepare_data.sh ... significance.sh. For tests.)
CONFIG_DIR="${REPRODUCE_CONFIG_DIR:-$REPO_DIR/configs/papers}"
PIPELINE_DIR="${REPRODUCE_PIPELINE_DIR:-$SCRIPTS_DIR}"
# The datasets: one manifest each in data/manifests (scripts/prepare_data.sh reads them).
DATASETS=()
for _m in "$REPO_DIR"/data/manifests/*.json; do _m="${_m##*/}"; DATASETS+=("${_m%.json}"); done
unset _m
. "$REPRO_DIR/config.sh"
. "$REPRO_DIR/rows.sh"
. "$REPRO_DIR/steps.sh"

# ------------------------------------------------------------------ options
reproduce_parse_args() {
    # the options, checked, as shell assignments (scripts/reproduce/plan.py)
    local script_name assignments HELP=0
    script_name="$(basename "$0" .sh)"
    assignments="$("$PY" "$REPRO_DIR/plan.py" --prog "$PROG" options --datasets "${DATASETS[*]}" \
        --paper-test "${TABLE_SIGNIFICANCE:-none}" -- "$@")" || exit 2
    declare -gA RAW_DIRS=()
    SLURM_SUBMIT_ARGS=() TABLE_ARGS=()
    eval "$assignments"
    if (( HELP )); then
        usage; echo; cat "$REPRO_DIR/options.txt"; echo; list_rows; exit 0
    fi
    rehearse_options "$script_name"
    slurm_options
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

# ------------------------------------------------------------------ output
# emit CMD...: --dry-run prints the command (quoted, runnable); otherwise run prints
# it on stderr and runs it.
emit() {
    if [[ -n "$SLURM_MODE" ]]; then
        local quoted
        printf -v quoted ' %q' "$@"
        slurm_emit "${quoted# }"
    elif (( DRY_RUN )); then
        local quoted
        printf -v quoted ' %q' "$@"
        echo "${quoted# }"
    else
        run "$@"
    fi
}

note() {
    if [[ "$SLURM_MODE" == status || "$SLURM_MODE" == cancel ]]; then
        return 0
    elif (( DRY_RUN )); then
        echo "# $*"
    else
        echo "${PROG}: $*" >&2
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
    if ! unknown="$(train_check arch -- "${archs[@]}" 2>/dev/null)"; then
        [[ -n "$unknown" ]] || die "importing fairseq_localness failed; run '$PY -c \"import fairseq_localness\"' to see why"
        die "architecture(s) not registered with fairseq: ${unknown%%$'\n'*} \
(see the ARCH of the configurations and the rows' --arch)"
    fi
    local checked=" " msg
    for i in "${SELECTED[@]}"; do
        [[ -f "${R_DATA[$i]}/PREPARED" || "$checked" == *" ${R_DATA[$i]} "* ]] && continue
        (( REHEARSE )) && [[ -n "$SLURM_MODE" ]] && continue  # (the fakes are written by the prepare job)
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

# record_run: WORK/run.json, what the page's "The run" shows (the command, the commit,
# the start, the hardware), when a run (or a --slurm submission) starts.
record_run() {
    local cmd devices table_args driver
    printf -v cmd ' %q' "$0" "${DRIVER_ARGS[@]}"
    printf -v table_args ' %q' "${TABLE_ARGS[@]}"
    (( ${#TABLE_ARGS[@]} )) || table_args=""
    driver="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
    if (( REHEARSE )); then devices="a rehearsal on the CPU"
    elif [[ -n "$SLURM_MODE" ]]; then devices="--slurm: $S_NODES node(s) x $S_GPN $( (( CPU )) && echo "CPU process(es)" || echo "GPU(s)") per run"
    elif (( CPU )); then devices="CPU"
    else devices="$GPUS GPU(s) per run"
    fi
    "$PY" "$SCRIPTS_DIR/report.py" "$WORK" --record-run --command "${cmd# }" --driver "$(basename "$0" .sh)" \
        --title "$TABLE_TITLE" --devices "$devices" --driver-path "$driver" --table-args "${table_args# }" \
        || note "warning: $WORK/run.json could not be written"
}

# write_report: WORK/report.html, the page of the table so far (fairseq-localness-report,
# through scripts/report.py, without fairseq); a page that cannot be written is a
# warning, the run's results stand.
write_report() {
    "$PY" "$SCRIPTS_DIR/report.py" "$WORK" || echo "${PROG}: warning: $WORK/report.html could not be written" >&2
}

reproduce_main() {
    DRIVER_ARGS=("$@")
    reproduce_parse_args "$@"
    if (( LIST_ONLY )); then
        list_rows
        return 0
    fi
    reproduce_load_rows
    slurm_check
    if (( TABLE_ONLY )); then
        write_table
        echo "(written to $WORK/results.md)" >&2
        write_report
        return 0
    fi
    local i seed
    for seed in "${SEEDS[@]}"; do
        use_seed "$seed"
        for i in "${SELECTED[@]}"; do
            load_row "$i"  # a run directory trained with other settings, or no batch split, stops us here
        done
    done
    (( DRY_RUN )) || slurm_busy
    rehearse_fakes
    (( DRY_RUN )) || preflight
    announce
    if (( ! DRY_RUN )); then
        record_run
        # a run that stops on a failing step still leaves the table and the page so far
        [[ -n "$SLURM_MODE" ]] || trap 'status=$?; if (( status )); then write_table > /dev/null 2>&1 || true; write_report; fi' EXIT
    fi
    [[ -z "$SLURM_MODE" ]] || note "--slurm: a job graph (every row and seed a train and an eval job) in $WORK/slurm"
    PREPARED_THIS_RUN=""
    for seed in "${SEEDS[@]}"; do  # seed by seed: a partial run has every row of the first seeds
        use_seed "$seed"
        (( ${#SEEDS[@]} == 1 )) || note "--- seed $seed"
        for i in "${SELECTED[@]}"; do
            run_row "$i"
        done
    done
    if [[ -n "$SLURM_MODE" ]]; then
        slurm_finish
        return 0
    fi
    (( DRY_RUN )) && echo "# table (from the results that exist now):"
    write_table
    (( DRY_RUN )) || write_report
}
