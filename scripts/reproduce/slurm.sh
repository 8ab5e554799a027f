# --slurm, --status and --cancel of the reproduce drivers: the job graph. Sourced by
# common.sh, do not run it.
#
# With --slurm the driver goes through its rows as a run would, with every step's
# checks (a step whose outputs are up to date is left out), but each command it would
# run is written into a job graph (WORK/slurm/graph.tsv) under the job that runs it:
#
#   prepare:<dataset>       the fakes (--rehearse) and prepare_data.sh of every direction
#                           and segmentation of a dataset the selected rows need, once
#   train:<row>:<seed>      train.sh --slurm-task in each of nodes x processes tasks, after
#                           its dataset's prepare job
#   eval:<row>:<seed>       average.sh (or the best checkpoint) and evaluate.sh, after its
#                           training
#   final                   the significance tests and the table (the driver's --table),
#                           after every evaluation has ended, whatever became of it
#
# and fairseq_localness/slurm/ submits the graph through submitit (the format of the
# graph is in its docstring). --status and --cancel build the same graph and read or
# cancel what was submitted from WORK/slurm (the rows and seeds it selects). A local run
# of a row whose job is queued or running there stops (slurm_busy): one trainer per run
# directory. docs/slurm.md explains it all.

SLURM_MODE=""   # submit, status or cancel (set by slurm_options)
SLURM_GRAPH=""
JOB_KEY=""

# slurm_options: after the options are parsed; --status and --cancel write nothing.
slurm_options() {
    if (( STATUS )); then SLURM_MODE=status
    elif (( CANCEL )); then SLURM_MODE=cancel
    elif (( SLURM )); then SLURM_MODE=submit
    else return 0
    fi
    [[ "$SLURM_MODE" == submit ]] || DRY_RUN=1
    SLURM_GRAPH="$(mktemp "${TMPDIR:-/tmp}/slurm-graph.XXXXXX")"
    trap 'rm -f "$SLURM_GRAPH"' EXIT
}

# slurm_py ARGS: python -m fairseq_localness.slurm, without importing fairseq (scripts/slurm.py)
slurm_py() {
    "$PY" "$SCRIPTS_DIR/slurm.py" --prog "$PROG" "$@"
}

# slurm_check: once the rows are read (an unknown row is refused without asking the
# cluster): the number of jobs against --max-jobs (with --dry-run a warning), then the
# options against the cluster (its partitions and their time limits), before anything else.
slurm_check() {
    [[ "$SLURM_MODE" == submit ]] || return 0
    local datasets i n
    datasets="$(for i in "${SELECTED[@]}"; do echo "${R_DATASET[$i]}"; done | sort -u | wc -l)"
    n=$(( ${#SELECTED[@]} * ${#SEEDS[@]} * 2 + datasets + 1 ))
    if (( n > S_MAX_JOBS )); then
        (( DRY_RUN )) || die "--slurm: up to $n jobs (${#SELECTED[@]} row(s) x ${#SEEDS[@]} seed(s), a training and an evaluation each), more than --max-jobs $S_MAX_JOBS (a guard against flooding the queue); give --max-jobs $n to submit them"
        echo "${PROG}: warning: up to $n jobs, more than --max-jobs $S_MAX_JOBS: submitting them needs --max-jobs $n" >&2
    fi
    slurm_py check "${SLURM_SUBMIT_ARGS[@]}" || exit $?
}

# slurm_busy: a local run (not --dry-run) stops when a selected row and seed has a job
# queued or running from WORK/slurm (its dataset's prepare job included).
slurm_busy() {
    [[ -z "$SLURM_MODE" && -f "$WORK/slurm/submitted.json" ]] || return 0
    local seed i
    for seed in "${SEEDS[@]}"; do
        for i in "${SELECTED[@]}"; do
            printf '%s\t%s\t%s\n' "${R_NAME[$i]}" "$seed" "${R_DATASET[$i]}"
        done
    done | slurm_py busy --state-dir "$WORK/slurm" || exit $?
}

# slurm_job KEY KIND i NEEDS: the commands emitted from now on belong to job KEY (of
# row i and the seed SEED; NEEDS: the keys of the jobs it runs after).
slurm_job() {
    [[ -n "$SLURM_MODE" ]] || return 0
    local key="$1" kind="$2" i="$3" needs="${4:-}" nodes=1 tasks=1 gpus=0
    if [[ "$kind" == train ]]; then
        if (( REHEARSE )); then
            tasks=$REHEARSE_PROCS
        else
            nodes=$S_NODES tasks=$S_GPN
            (( CPU )) || gpus=$S_GPN
        fi
    elif [[ "$kind" == eval ]] && (( ! CPU )); then
        gpus=1
    fi
    JOB_KEY="$key"
    printf 'JOB\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$key" "$kind" "${R_NAME[$i]:-}" "$SEED" "$nodes" "$tasks" \
        "$gpus" "$needs" >> "$SLURM_GRAPH"
}

# slurm_emit QUOTED: emit's part with --slurm: the command goes into the graph.
slurm_emit() {
    printf 'CMD\t%s\t%s\n' "$JOB_KEY" "$1" >> "$SLURM_GRAPH"
}

# slurm_row i: a row and seed of the table: its run directory and score file.
slurm_row() {
    [[ -n "$SLURM_MODE" ]] || return 0
    printf 'ROW\t%s\t%s\t%s\t%s\t%s\n' "${R_NAME[$1]}" "$SEED" "${R_RUN[$1]}" "$ROW_SCORE" "${R_DATASET[$1]}" \
        >> "$SLURM_GRAPH"
}

# slurm_train_hw: train.sh's devices inside a train job (HW).
slurm_train_hw() {
    if (( REHEARSE )); then
        HW=(--gpus "$REHEARSE_PROCS" --cpu --slurm-task)
    elif (( CPU )); then
        HW=(--gpus "$S_GPN" --nodes "$S_NODES" --cpu --slurm-task)
    else
        HW=(--gpus "$S_GPN" --nodes "$S_NODES" --slurm-task)
    fi
}

# slurm_finish: the table job, then submit (or dry-run), print the status or cancel.
slurm_finish() {
    local driver table=()
    driver="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
    slurm_job final final "" ""
    printf -v table ' %q' bash "$driver" "${TABLE_ARGS[@]}" --work-dir "$WORK" --table
    slurm_emit "#table${table}"
    local state="$WORK/slurm"
    case "$SLURM_MODE" in
        submit)
            local dry=()
            (( DRY_RUN )) && dry=(--dry-run)
            slurm_py submit --graph "$SLURM_GRAPH" --state-dir "$state" "${SLURM_SUBMIT_ARGS[@]}" "${dry[@]}" \
                || exit $? ;;
        status|cancel)
            slurm_py "$SLURM_MODE" --graph "$SLURM_GRAPH" --state-dir "$state" || exit $? ;;
    esac
    # --status: the table and the page of what has finished so far
    if [[ "$SLURM_MODE" == status && -f "$state/submitted.json" ]]; then
        { DRY_RUN=0 write_table > /dev/null && write_report; } || echo "${PROG}: warning: no table or page" >&2
    fi
}
