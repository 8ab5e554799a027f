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
# cancel what was submitted from WORK/slurm. docs/slurm.md explains it all.

SLURM_MODE=""   # submit, status or cancel (set by slurm_options)
SLURM_GRAPH=""
JOB_KEY=""

# slurm_options: after the options are parsed; --status and --cancel write nothing.
slurm_options() {
    if (( SLURM )); then SLURM_MODE=submit
    elif (( STATUS )); then SLURM_MODE=status
    elif (( CANCEL )); then SLURM_MODE=cancel
    else return 0
    fi
    [[ "$SLURM_MODE" == submit ]] || DRY_RUN=1
    if [[ "$SLURM_MODE" == submit ]]; then  # the cluster and the options, before anything else
        "$PY" -m fairseq_localness.slurm --prog "$PROG" check "${SLURM_SUBMIT_ARGS[@]}" || exit 2
    fi
    SLURM_GRAPH="$(mktemp "${TMPDIR:-/tmp}/slurm-graph.XXXXXX")"
    trap 'rm -f "$SLURM_GRAPH"' EXIT
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
    local state="$WORK/slurm" py_args=(--prog "$PROG")
    case "$SLURM_MODE" in
        submit)
            if (( DRY_RUN )); then
                "$PY" -m fairseq_localness.slurm "${py_args[@]}" submit --graph "$SLURM_GRAPH" --state-dir "$state" \
                    "${SLURM_SUBMIT_ARGS[@]}" --dry-run || exit $?
            else
                mkdir -p "$state"
                cp "$SLURM_GRAPH" "$state/graph.tsv"
                "$PY" -m fairseq_localness.slurm "${py_args[@]}" submit --graph "$state/graph.tsv" \
                    --state-dir "$state" "${SLURM_SUBMIT_ARGS[@]}" || exit $?
            fi ;;
        status|cancel)
            "$PY" -m fairseq_localness.slurm "${py_args[@]}" "$SLURM_MODE" --graph "$SLURM_GRAPH" --state-dir "$state" \
                || exit $? ;;
    esac
    # --status: the table and the page of what has finished so far
    if [[ "$SLURM_MODE" == status && -f "$state/submitted.json" ]]; then
        { DRY_RUN=0 write_table > /dev/null && write_report; } || echo "${PROG}: warning: no table or page" >&2
    fi
}
