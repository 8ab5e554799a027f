#!/usr/bin/env bash
# Train a translation model with fairseq-train, with fairseq_localness as --user-dir.
#
# Usage: train.sh --arch ARCH --data-bin DIR --save-dir DIR --max-update N \
#                 --src LANG --tgt LANG [--seed N] [--preset NAME] [--gpus N] [--cpu] \
#                 [--nodes N --node-rank R --master-addr HOST [--master-port P]] \
#                 [--effective-tokens T] [--precision auto|fp32|fp16|bf16] [--dry-run] \
#                 [-- EXTRA fairseq-train args...]
#
# Resumption: fairseq restarts from SAVE_DIR/checkpoint_last.pt (model, optimizer,
# scheduler, data position), so rerunning the same command after an interruption
# continues where the last saved checkpoint left off. fairseq writes
# checkpoint_last.pt by copying, so a run killed during a save can leave it truncated;
# train.sh then resumes from the newest readable checkpoint fairseq wrote in SAVE_DIR
# (checkpoint_best.pt, checkpointN.pt, checkpoint_E_U.pt; --restore-file), says so, and
# stops with an error when there is none (the unreadable file is left as it is).
#
# Defaults (the Transformer-base recipe of fairseq's translation examples):
#   --optimizer adam --adam-betas '(0.9,0.98)' --clip-norm 0.0 --lr 5e-4
#   --lr-scheduler inverse_sqrt --warmup-updates 4000 --dropout 0.3
#   --weight-decay 0.0001 --criterion label_smoothed_cross_entropy
#   --label-smoothing 0.1 --max-tokens 4096 --log-format json --log-interval 100
#   --tensorboard-logdir SAVE_DIR/tensorboard
#
# Logs: --log-format json, so every training and validation record (train_inner,
# train, valid) is one JSON object after fairseq's logger prefix, which
# `fairseq-localness-analysis learning_curves` / `efficiency` and the demo's and
# reproduce scripts' tables read. TensorBoard: event files of every metric in
# SAVE_DIR/tensorboard (tensorboardX is installed with this package; `-- --tensorboard-logdir
# DIR` puts them elsewhere), so `tensorboard --logdir` on any folder above shows every run.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
. "$(dirname "${BASH_SOURCE[0]}")/batch_split.sh"

ORIG_ARGS=("$@")
parse_options "$@" <<'EOF'
--arch ARCH           ARCH          text                        required
    any registered architecture: fairseq's (transformer, ...) or
    this package's (localness_transformer, hybrid_transformer, ...)
--data-bin DIR        DATA_BIN      dir                         required
    preprocess.sh output with train and valid data for SRC-TGT
--save-dir DIR        SAVE_DIR      text                        required
    checkpoints go here; if it holds checkpoint_last.pt, training
    resumes from it (fairseq's behaviour); if that file cannot be read
    (a run killed while saving it), from the newest readable checkpoint
--max-update N        MAX_UPDATE    int:1                       required
    number of updates to train for
--src LANG            SRC           lang                        required
--tgt LANG            TGT           lang                        required
    language pair
--seed N              SEED          int:0                       1
    random seed (default 1)
--preset NAME         PRESET        text                        -
    model size and recipe from configs/presets/NAME.sh, between the
    defaults below and EXTRA (which overrides it). tiny: the demo's
    model (2+2 layers, d=64, 4 heads, FFN 256, shared embeddings;
    needs a joined dictionary) and short-schedule recipe (--lr 2e-3
    --warmup-updates 100 --clip-norm 1.0 --dropout 0.1 --max-tokens
    2048 --num-workers 0), for a first run on the CPU. An unknown
    NAME is an error that lists the presets.
--dry-run             DRY_RUN       flag                        -
    check everything, print the command, do not train
-- EXTRA...           EXTRA         rest:fairseq-train          -
    more fairseq-train arguments. They come after the defaults
    below, and for an option given twice the later value wins, so
    EXTRA can override any default.
Devices and processes:
--gpus N              GPUS          int:0                       0
    processes (GPUs) per node, started by torchrun (python -m
    torch.distributed.run) for fairseq's own distributed data-parallel
    training. --gpus 1 on one node: one fairseq-train process on one GPU.
    0 or absent: fairseq-train as before (the CPU without GPUs; fairseq
    itself spawns one process per visible GPU on a multi-GPU machine).
--cpu                 CPU           flag                        -
    train on the CPU (fairseq's --cpu); with --gpus N, N processes on
    the CPU that communicate over gloo
--nodes N             NODES         int:1                       1
    number of machines (default 1); run the same command on each, with
    --node-rank and --master-addr (and --master-port)
--node-rank R         NODE_RANK     int:0                       0
    this machine's rank, 0 .. N-1 (default 0)
--master-addr HOST    MASTER_ADDR   text                        -
--master-port P       MASTER_PORT   int:1                       -
    the address of node 0 (the port default: 29500)
    One node without --master-port: torchrun --standalone (a free port).
--precision P         PRECISION     choice:auto|fp32|fp16|bf16  auto
    auto (default): fp16 on CUDA GPUs of compute capability >= 7, else
    bf16 on a TPU (torch_xla installed, no CUDA GPU), else fp32; fp32
    with --cpu. bf16: on a CUDA GPU, a TPU or the CPU (fairseq's --bf16
    implies --tpu; the package turns that off without torch_xla or
    with --cpu).
    fairseq trains in fp16 only on CUDA GPUs: asking for a precision the
    machine cannot do is an error before training.
Batch size:
--effective-tokens T  EFF_TOKENS    int:1                       -
    the papers' batch size in tokens per update, kept whatever
    the number of processes: sets --update-freq u = ceil(T / (cap x
    processes)) and the per-process --max-tokens m = floor(T /
    (processes x u)), where cap is the --max-tokens in effect (EXTRA's,
    else 4096: the most one process may hold) and processes = gpus x
    nodes (1 for a single process); m x processes x u is at most T and
    within a token per process and batch of it. Prints the computation;
    a split whose m cannot hold the longest training pair is an error
    (it names the numbers). --max-tokens-valid stays at cap. Giving
    --update-freq in EXTRA as well is an error.
SLURM (docs/slurm.md):
--slurm               SLURM_SUBMIT  flag                        -
    submit the training as one SLURM job of --nodes x --gpus (or
    --gpus-per-node) tasks, through submitit, and return; requeued
    and resumed at its time limit; its state in SAVE_DIR/slurm/. With
    --dry-run: print the job, submit nothing
--partition P         SLURM_OPTS    pass                        -
    the partition (default: the cluster's)
--gpus-per-node N     SLURM_OPTS    pass                        -
    GPUs (processes) per node (default: --gpus, else 1); with --cpu, N
    processes on each node's CPUs (gloo)
--cpus-per-task N     SLURM_OPTS    pass                        -
    CPUs per task
--mem M               SLURM_OPTS    pass                        -
    memory per node (e.g. 64G)
--time T              SLURM_OPTS    pass                        -
    the job's time limit (minutes, HH:MM:SS, D-HH:MM, ...; default the
    partition's); a training past it is requeued and resumes
--account A           SLURM_OPTS    pass                        -
--qos Q               SLURM_OPTS    pass                        -
--constraint C        SLURM_OPTS    pass                        -
    the account to charge, the quality of service, node features
--max-requeues N      SLURM_OPTS    pass                        -
    requeues before the job is failed (default 3)
--signal-delay S      SLURM_OPTS    pass                        -
    seconds before the time limit at which the job saves and requeues
    (default 90)
--slurm-arg K=V       SLURM_OPTS    pass                        -
    any other sbatch option, by its long name (repeatable); not one
    that the job sets itself (time, signal, dependency, output, ...)
--status              SLURM_STATUS  flag                        -
    with --slurm: the job's state, id and log (the submitted command
    with --status appended); submits nothing
--cancel              SLURM_CANCEL  flag                        -
    with --slurm: cancel the job if it is queued or running
--slurm-task          SLURM_TASK    flag                        -
    run as one task of the job --slurm submitted (the job's command)
EOF
TASK_ARGS=()

# ---- validate (cheap checks first; then one process that imports fairseq checks the
# architecture and every fairseq-train argument, and reads the hardware and the run
# directory's checkpoints: a bad fairseq-train argument is named before a --gpus or
# --precision that this machine's hardware cannot run)
GPUS=$((10#$GPUS)) NODES=$((10#$NODES)) NODE_RANK=$((10#$NODE_RANK))
(( NODE_RANK < NODES )) || die "--node-rank: expected 0 .. $((NODES - 1)) (--nodes $NODES), got $NODE_RANK"
if [[ -n "$MASTER_PORT" ]]; then
    (( 10#$MASTER_PORT <= 65535 )) || die "--master-port: expected a TCP port 1 .. 65535, got '$MASTER_PORT'"
fi
if [[ -n "$MASTER_ADDR" ]]; then
    [[ "$MASTER_ADDR" =~ ^[A-Za-z0-9._:-]+$ ]] || die "--master-addr: expected a host name or IP address, got '$MASTER_ADDR'"
fi
if (( SLURM_TASK )); then
    (( SLURM_SUBMIT == 0 )) || die "--slurm and --slurm-task: expected one of them, not both"
    [[ -n "${SLURM_PROCID:-}" && -n "${SLURM_NTASKS:-}" ]] || die "--slurm-task: expected to run as a task of a \
SLURM job (SLURM_PROCID and SLURM_NTASKS are not set); submit with --slurm instead"
    (( GPUS >= 1 )) || die "--slurm-task: expected --gpus N (processes per node, >= 1)"
    (( SLURM_NTASKS == GPUS * NODES )) || die "--slurm-task: the job has $SLURM_NTASKS task(s); expected --nodes \
$NODES x --gpus $GPUS = $((GPUS * NODES)) (one task per process)"
elif (( NODES > 1 && ! SLURM_SUBMIT )); then
    (( GPUS >= 1 )) || die "--nodes $NODES: expected --gpus N (processes per node, >= 1) for a multi-node run"
    [[ -n "$MASTER_ADDR" ]] || die "--nodes $NODES: expected --master-addr HOST (the address of node 0, reachable from every node)"
fi
if [[ -n "$EFF_TOKENS" ]]; then
    EFF_TOKENS=$((10#$EFF_TOKENS))
fi
# The preset: configs/presets/NAME.sh sets PRESET_ARGS, fairseq-train arguments that
# come after the recipe's defaults and before EXTRA.
PRESET_ARGS=()
if [[ -n "$PRESET" ]]; then
    PRESETS_DIR="$REPO_DIR/configs/presets"
    names="$(cd "$PRESETS_DIR" 2>/dev/null && ls -- *.sh 2>/dev/null | sed 's/\.sh$//' | tr '\n' ' ')"
    [[ "$PRESET" =~ ^[A-Za-z0-9_-]+$ && -f "$PRESETS_DIR/$PRESET.sh" ]] \
        || die "--preset: unknown preset '$PRESET'; expected one of: ${names:-(none in $PRESETS_DIR)}"
    . "$PRESETS_DIR/$PRESET.sh"
    (( ${#PRESET_ARGS[@]} )) || die "--preset $PRESET: $PRESETS_DIR/$PRESET.sh sets no PRESET_ARGS"
fi
# What the preset and EXTRA say about batch size and precision (the last occurrence
# wins in fairseq).
MAX_TOKENS=4096 EXTRA_UPDATE_FREQ="" EXTRA_PRECISION="" EXTRA_VALID_BATCH="" EXTRA_RESTORE=""
GIVEN=("${PRESET_ARGS[@]}" "${EXTRA[@]}")
for (( i = 0; i < ${#GIVEN[@]}; i++ )); do
    a="${GIVEN[i]}"
    case "$a" in
        --max-tokens) MAX_TOKENS="${GIVEN[i+1]:-}" ;;
        --max-tokens=*) MAX_TOKENS="${a#*=}" ;;
        --max-tokens-valid|--max-tokens-valid=*|--batch-size-valid|--batch-size-valid=*) EXTRA_VALID_BATCH="$a" ;;
        --restore-file|--restore-file=*) EXTRA_RESTORE="$a" ;;
        --update-freq|--update-freq=*) EXTRA_UPDATE_FREQ="$a" ;;
        --fp16|--bf16|--amp|--memory-efficient-fp16|--memory-efficient-bf16) EXTRA_PRECISION="$a" ;;
    esac
done
if [[ -n "$EFF_TOKENS" ]]; then
    [[ -z "$EXTRA_UPDATE_FREQ" ]] || die "--effective-tokens: sets --update-freq itself; expected no --update-freq \
after -- (give one or the other)"
    [[ "$MAX_TOKENS" =~ ^[0-9]+$ ]] && (( 10#$MAX_TOKENS >= 1 )) \
        || die "--effective-tokens: needs the --max-tokens in effect to be a whole number >= 1; got '$MAX_TOKENS'"
fi
if [[ -n "$EXTRA_PRECISION" && "$PRECISION" != auto ]]; then
    die "--precision $PRECISION: conflicts with $EXTRA_PRECISION after --; expected one of them"
fi
if (( CPU )); then
    [[ "$PRECISION" == fp16 ]] && die "--precision $PRECISION: not possible with --cpu \
(fairseq trains in fp16 only on CUDA GPUs); expected --precision fp32, bf16 or auto"
    [[ -z "$EXTRA_PRECISION" || "$EXTRA_PRECISION" == *bf16 ]] || die "$EXTRA_PRECISION (after --): not possible \
with --cpu (fairseq trains in fp16 only on CUDA GPUs)"
fi
require_pair "$DATA_BIN" "$SRC" "$TGT" train valid
[[ ! -e "$SAVE_DIR" || -d "$SAVE_DIR" ]] || die "--save-dir: '$SAVE_DIR' exists and is not a directory"

# --slurm: one job of --nodes x --gpus tasks that runs this command with --slurm-task
# (fairseq_localness/slurm/, through submitit); checked here, on the machine that submits
if (( SLURM_STATUS || SLURM_CANCEL )); then
    (( SLURM_SUBMIT )) || die "--$( (( SLURM_STATUS )) && echo status || echo cancel): only with --slurm (the \
submitted command with it appended)"
    (( ! (SLURM_STATUS && SLURM_CANCEL) )) || die "--status and --cancel: expected one of them, not both"
fi
# the checks below answer one line per item (the checkpoint to resume from), and SLURM's
# job scripts take one line per option
[[ "$SAVE_DIR" != *[$'\n\r']* ]] || die "--save-dir: '$SAVE_DIR' has a line break; train.sh reads the run \
directory as one line: expected a directory without one"
if (( SLURM_SUBMIT )); then
    # (the absolute path, as sbatch gets it; --status and --cancel read what was submitted before)
    [[ "$SAVE_DIR" == /* ]] && abs_save="$SAVE_DIR" || abs_save="$PWD/$SAVE_DIR"
    (( SLURM_STATUS || SLURM_CANCEL )) || [[ "$abs_save" != *[%\\]* ]] || die "--save-dir: '$abs_save' has a '%' \
or a backslash; sbatch reads the job's log paths (in SAVE_DIR/slurm/logs) as patterns ('%j' is the job id, a \
backslash turns the patterns off): expected a directory without either"
    GPN="" k=0
    for (( k = 0; k < ${#SLURM_OPTS[@]}; k += 2 )); do
        [[ "${SLURM_OPTS[k]}" == --gpus-per-node ]] && GPN="${SLURM_OPTS[k+1]}"
    done
    if [[ -n "$GPN" ]]; then
        require_int --gpus-per-node "$GPN" 1
        (( GPUS == 0 || GPUS == 10#$GPN )) || die "--gpus $GPUS and --gpus-per-node $GPN: conflicting GPU counts \
(with --slurm both are the processes of each node); expected one of them, or the same number"
        GPUS=$((10#$GPN))
    fi
    (( GPUS >= 1 )) || GPUS=1
    # the command of each task: these options without the submission's
    skip=0
    for a in "${ORIG_ARGS[@]}"; do
        if (( skip )); then skip=0; continue; fi
        case "$a" in
            --slurm|--dry-run|--status|--cancel) continue ;;
            --partition|--gpus-per-node|--cpus-per-task|--mem|--time|--account|--qos|--constraint|--max-requeues|--signal-delay|--slurm-arg|--gpus|--nodes)
                skip=1; continue ;;
            --) break ;;
        esac
        TASK_ARGS+=("$a")
    done
    printf -v task_cmd ' %q' bash "$SCRIPTS_DIR/train.sh" "${TASK_ARGS[@]}" --gpus "$GPUS" --nodes "$NODES" \
        --slurm-task -- "${EXTRA[@]}"
    GRAPH="$(mktemp "${TMPDIR:-/tmp}/train-graph.XXXXXX")"
    trap 'rm -f "$GRAPH"' EXIT
    gpus=$GPUS
    (( CPU )) && gpus=0
    printf 'JOB\ttrain:%s\ttrain\t%s\t%s\t%s\t%s\t%s\t\n' "$(basename "$SAVE_DIR")" "$(basename "$SAVE_DIR")" \
        "$SEED" "$NODES" "$GPUS" "$gpus" > "$GRAPH"
    printf 'CMD\ttrain:%s\t%s\n' "$(basename "$SAVE_DIR")" "${task_cmd# }" >> "$GRAPH"
    if (( SLURM_STATUS || SLURM_CANCEL )); then
        "$PY" "$SCRIPTS_DIR/slurm.py" --prog "$PROG" "$( (( SLURM_STATUS )) && echo status || echo cancel)" \
            --graph "$GRAPH" --state-dir "$SAVE_DIR/slurm"
        exit $?
    fi
    sub=(submit --graph "$GRAPH" --state-dir "$SAVE_DIR/slurm" --nodes "$NODES" --gpus-per-node "$GPUS")
    (( DRY_RUN )) && sub+=(--dry-run)
    k=0
    for (( k = 0; k < ${#SLURM_OPTS[@]}; k += 2 )); do
        [[ "${SLURM_OPTS[k]}" == --gpus-per-node ]] || sub+=("${SLURM_OPTS[k]}" "${SLURM_OPTS[k+1]}")
    done
    (( DRY_RUN )) || mkdir -p "$SAVE_DIR"
    "$PY" "$SCRIPTS_DIR/slurm.py" --prog "$PROG" "${sub[@]}"
    exit $?
fi
if (( ! SLURM_SUBMIT && ${#SLURM_OPTS[@]} )); then
    die "${SLURM_OPTS[0]}: only with --slurm (submit the training as a SLURM job)"
fi
# one trainer per run directory: the first process of a training holds SAVE_DIR/.train.lock
# from here (an existing directory) or from the start of fairseq-train (a new one) until
# fairseq ends (its processes inherit it); another training of SAVE_DIR stops, whether it
# runs here or as a SLURM job (a job's other tasks are its own processes)
TRAIN_LOCK=""
hold_save_dir() {
    (( ! DRY_RUN && ! ${#TRAIN_LOCK} )) && (( ! SLURM_TASK || ${SLURM_PROCID:-0} == 0 )) || return 0
    mkdir -p "$SAVE_DIR"
    exec {TRAIN_LOCK}>>"$SAVE_DIR/.train.lock"
    flock -w 5 "$TRAIN_LOCK" || die "--save-dir: another training is running in '$SAVE_DIR' \
($(head -c 200 "$SAVE_DIR/.train.lock" | tr '\n' ' ')); one trainer per run directory: wait for it or stop it"
    echo "pid $$ on $(hostname)${SLURM_JOB_ID:+, SLURM job $SLURM_JOB_ID}, since $(date -u '+%F %T') UTC" \
        > "$SAVE_DIR/.train.lock"
}
[[ -d "$SAVE_DIR" ]] && hold_save_dir

USER_DIR="$(user_dir)"
# The recipe's defaults (see the header); arguments after -- come after them.
RECIPE=(--optimizer adam --adam-betas '(0.9,0.98)' --clip-norm 0.0 --lr 5e-4
    --lr-scheduler inverse_sqrt --warmup-updates 4000 --dropout 0.3
    --weight-decay 0.0001 --criterion label_smoothed_cross_entropy
    --label-smoothing 0.1 --max-tokens 4096 --log-format json --log-interval 100
    --tensorboard-logdir "$SAVE_DIR/tensorboard")
# The architecture and every fairseq-train argument after --, model options
# included, parsed as fairseq-train parses them: a bad one stops here with exit
# status 2, before anything is printed or --save-dir exists.
# With --effective-tokens it also reads the longest training pair (fairseq's index
# reader; pairs longer than the model's positions left out, as fairseq drops them).
# In the same process, each where it applies: the hardware (CUDA devices, the compute
# capability of the first, torch_xla: where it is installed, fairseq 0.12's --bf16 means
# training on TPUs), and what the training resumes from where a run directory exists
# and no --restore-file is given (checkpoint_last.pt, or the newest readable checkpoint
# when it cannot be read; see "Resumption" below).
CHECK_OPTS=()
(( CPU )) || CHECK_OPTS+=(--hardware)
[[ -z "$EXTRA_RESTORE" && -d "$SAVE_DIR" ]] && CHECK_OPTS+=(--resume-from "$SAVE_DIR")
[[ -n "$EFF_TOKENS" ]] && CHECK_OPTS+=(--print-longest-pair)
CHECKED="$(check_train_args "${CHECK_OPTS[@]}" "$DATA_BIN" --user-dir "$USER_DIR" --task translation \
    --source-lang "$SRC" --target-lang "$TGT" --arch "$ARCH" "${RECIPE[@]}" "${PRESET_ARGS[@]}" --seed "$SEED" \
    --max-update "$MAX_UPDATE" --save-dir "$SAVE_DIR" "${EXTRA[@]}")" || exit 2
LONGEST="${CHECKED##*$'\n'}"  # the last line: the number
[[ "$LONGEST" =~ ^[0-9]+$ ]] || LONGEST=0
RESUME="$(sed -n 's/^resume: //p' <<<"$CHECKED" | tail -n 1)"
N_CUDA=0 CC_MAJOR=0 BF16_OK=0
read -r N_CUDA CC_MAJOR BF16_OK < <(sed -n 's/^hardware: //p' <<<"$CHECKED" | tail -n 1; echo "0 0 0")
if (( ! CPU && GPUS > 0 && N_CUDA < GPUS )); then
    die "--gpus $GPUS: this machine has $N_CUDA CUDA GPU(s); expected --gpus <= $N_CUDA \
(or --cpu to run $GPUS processes on the CPU)"
fi
ON_GPU=0
(( ! CPU && N_CUDA > 0 )) && ON_GPU=1
PRECISION_ARGS=()
case "$PRECISION" in
    auto)
        if [[ -z "$EXTRA_PRECISION" ]]; then
            if (( ON_GPU && CC_MAJOR >= 7 )); then
                PRECISION_ARGS=(--fp16)
            elif (( ! CPU && N_CUDA == 0 && BF16_OK )); then
                PRECISION_ARGS=(--bf16)
            fi
        fi ;;
    fp16)
        (( ON_GPU )) || die "--precision fp16: needs a CUDA GPU and this machine has none; expected --precision fp32 or auto"
        PRECISION_ARGS=(--fp16) ;;
    bf16)
        PRECISION_ARGS=(--bf16) ;;
    fp32) ;;
esac
case "$EXTRA_PRECISION" in
    --bf16|--memory-efficient-bf16) ;;
    ?*)
        (( ON_GPU )) || die "$EXTRA_PRECISION (after --): needs a CUDA GPU and this machine has none" ;;
esac

# ---- the command
WORLD=1
(( GPUS > 0 )) && WORLD=$(( GPUS * NODES ))
DEVICE_ARGS=()
(( CPU )) && DEVICE_ARGS+=(--cpu)
if (( WORLD > 1 )); then
    if (( ON_GPU )); then backend=nccl; else backend=gloo; fi
    DEVICE_ARGS+=(--distributed-world-size "$WORLD" --distributed-backend "$backend")
    # one task per process: fairseq starts from SLURM's environment (rank SLURM_PROCID,
    # the first node of the job's node list as the address, this port)
    (( SLURM_TASK )) && DEVICE_ARGS+=(--distributed-port "$(( 20000 + ${SLURM_JOB_ID:-0} % 20000 ))")
elif (( GPUS == 1 )); then
    DEVICE_ARGS+=(--distributed-world-size 1)  # one GPU even where more are visible
fi
BATCH_ARGS=()
if [[ -n "$EFF_TOKENS" ]]; then
    # the processes that share an update: fairseq starts one per visible GPU when
    # --gpus is absent on a machine with several
    BATCH_WORLD=$WORLD
    (( GPUS == 0 && ! CPU && N_CUDA > 1 )) && BATCH_WORLD=$N_CUDA
    batch_split "$EFF_TOKENS" "$BATCH_WORLD" "$((10#$MAX_TOKENS))" "$LONGEST" \
        || die "--effective-tokens $EFF_TOKENS: no split over $BATCH_WORLD process(es): $BATCH_ERROR"
    BATCH_ARGS=(--max-tokens "$BATCH_MAX_TOKENS" --update-freq "$BATCH_UPDATE_FREQ")
    if [[ -z "$EXTRA_VALID_BATCH" ]] && (( BATCH_MAX_TOKENS < 10#$MAX_TOKENS )); then
        BATCH_ARGS+=(--max-tokens-valid "$((10#$MAX_TOKENS))")  # validation needs no smaller batches
    fi
    echo "${PROG}: --effective-tokens $BATCH_TEXT; longest training pair: ${LONGEST/#0/unknown} tokens" >&2
fi
# Resumption: checkpoint_last.pt, or the newest readable checkpoint when it cannot be read
# (RESUME, from the check above).
RESUME_ARGS=()
case "$RESUME" in
    "refused "*) die "--save-dir: ${RESUME#refused }" ;;
    last) echo "${PROG}: resuming from $SAVE_DIR/checkpoint_last.pt" >&2 ;;
    "unreadable "?*)
        RESUME_ARGS=(--restore-file "${RESUME#unreadable }")
        echo "${PROG}: $SAVE_DIR/checkpoint_last.pt cannot be read (cut short while it was saved?); resuming from the newest readable checkpoint, ${RESUME#unreadable } (--restore-file)" >&2 ;;
    unreadable*)
        die "--save-dir: $SAVE_DIR/checkpoint_last.pt cannot be read (cut short while it was saved?) and no other \
checkpoint there can be read to resume from; expected a readable checkpoint_*.pt, or remove checkpoint_last.pt to \
train from the start" ;;
esac
if [[ -n "$EXTRA_PRECISION" ]]; then
    echo "${PROG}: precision: $EXTRA_PRECISION (from the arguments after --)" >&2
else
    if (( ON_GPU )); then
        hw="$N_CUDA CUDA GPU(s), compute capability $CC_MAJOR.x"
    elif [[ "${PRECISION_ARGS[*]:-}" == --bf16 ]] && (( BF16_OK )); then
        hw="TPU through torch_xla"
    else
        hw="CPU"
    fi
    echo "${PROG}: precision: ${PRECISION_ARGS[*]:-fp32} (--precision $PRECISION; $hw)" >&2
fi

TRAIN_ARGS=("$DATA_BIN"
    --user-dir "$USER_DIR"
    --task translation --source-lang "$SRC" --target-lang "$TGT"
    --arch "$ARCH"
    "${RECIPE[@]}" "${PRESET_ARGS[@]}"
    --seed "$SEED" --max-update "$MAX_UPDATE" --save-dir "$SAVE_DIR"
    "${DEVICE_ARGS[@]}" "${PRECISION_ARGS[@]}"
    "${EXTRA[@]}" "${BATCH_ARGS[@]}" "${RESUME_ARGS[@]}")
if (( WORLD > 1 && ! SLURM_TASK )); then
    LAUNCH=("$PY" -m torch.distributed.run --nproc_per_node "$GPUS")
    if (( NODES > 1 )) || [[ -n "$MASTER_PORT" ]]; then
        LAUNCH+=(--nnodes "$NODES" --node_rank "$NODE_RANK" --master_addr "${MASTER_ADDR:-127.0.0.1}"
                 --master_port "${MASTER_PORT:-29500}")
    else
        LAUNCH+=(--standalone)
    fi
    CMD=("${LAUNCH[@]}" -m fairseq_cli.train "${TRAIN_ARGS[@]}")
else
    CMD=(fairseq-train "${TRAIN_ARGS[@]}")
    # a SLURM task on the CPU: fairseq would select CUDA device SLURM_LOCALID
    (( SLURM_TASK && CPU && WORLD > 1 )) && CMD=(env SLURM_LOCALID=0 "${CMD[@]}")
fi

if (( DRY_RUN )); then
    printf -v quoted ' %q' "${CMD[@]}"
    echo "${PROG}: dry run, not training:${quoted}"
    exit 0
fi

# ---- work
hold_save_dir
run "${CMD[@]}"
