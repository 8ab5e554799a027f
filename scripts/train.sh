#!/usr/bin/env bash
# Train a translation model with fairseq-train, with fairseq_localness as --user-dir.
#
# Usage: train.sh --arch ARCH --data-bin DIR --save-dir DIR --max-update N \
#                 --src LANG --tgt LANG [--seed N] [--gpus N] [--cpu] \
#                 [--nodes N --node-rank R --master-addr HOST [--master-port P]] \
#                 [--effective-tokens T] [--precision auto|fp32|fp16|bf16] [--dry-run] \
#                 [-- EXTRA fairseq-train args...]
#
#   --arch ARCH       any registered architecture: fairseq's (transformer, ...) or
#                     this package's (localness_transformer, hybrid_transformer, ...)
#   --data-bin DIR    preprocess.sh output with train and valid data for SRC-TGT
#   --save-dir DIR    checkpoints go here; if it holds checkpoint_last.pt, training
#                     resumes from it (fairseq's behaviour)
#   --max-update N    number of updates to train for
#   --src, --tgt      language pair
#   --seed N          random seed (default 1)
#
# Devices and processes:
#   --gpus N          processes (GPUs) per node, started by torchrun (python -m
#                     torch.distributed.run) for fairseq's own distributed data-parallel
#                     training. --gpus 1 on one node: one fairseq-train process on one GPU.
#                     0 or absent: fairseq-train as before (the CPU without GPUs; fairseq
#                     itself spawns one process per visible GPU on a multi-GPU machine).
#   --cpu             train on the CPU (fairseq's --cpu); with --gpus N, N processes on
#                     the CPU that communicate over gloo
#   --nodes N         number of machines (default 1); run the same command on each, with
#   --node-rank R     this machine's rank, 0 .. N-1 (default 0), and
#   --master-addr HOST --master-port P   the address of node 0 (the port default: 29500)
#                     One node without --master-port: torchrun --standalone (a free port).
#   --precision P     auto (default): fp16 on CUDA GPUs of compute capability >= 7, else
#                     bf16 where fairseq supports it, else fp32; fp32 with --cpu. fairseq
#                     0.12 trains in fp16 only on CUDA GPUs and in bf16 only on TPUs (its
#                     --bf16 implies --tpu and needs torch_xla): asking for a precision the
#                     machine cannot do is an error before training.
#
# Batch size:
#   --effective-tokens T   the papers' batch size in tokens per update: sets
#                     --update-freq = ceil(T / (max_tokens x processes)), with the
#                     --max-tokens in effect (EXTRA's, else 4096) and processes =
#                     gpus x nodes (1 for a single process), and prints the computation.
#                     Giving --update-freq in EXTRA as well is an error.
#   --dry-run         check everything, print the command, do not train
#
#   -- EXTRA...       more fairseq-train arguments. They come after the defaults
#                     below, and for an option given twice the later value wins, so
#                     EXTRA can override any default.
#
# Resumption: fairseq restarts from SAVE_DIR/checkpoint_last.pt (model, optimizer,
# scheduler, data position), so rerunning the same command after an interruption
# continues where the last saved checkpoint left off.
#
# Defaults (the Transformer-base recipe of fairseq's translation examples):
#   --optimizer adam --adam-betas '(0.9,0.98)' --clip-norm 0.0 --lr 5e-4
#   --lr-scheduler inverse_sqrt --warmup-updates 4000 --dropout 0.3
#   --weight-decay 0.0001 --criterion label_smoothed_cross_entropy
#   --label-smoothing 0.1 --max-tokens 4096 --log-format json --log-interval 100
#
# Logs: --log-format json, so every training and validation record (train_inner,
# train, valid) is one JSON object after fairseq's logger prefix, which
# `fairseq-localness-analysis learning_curves` / `efficiency` and the demo's and
# reproduce scripts' tables read. TensorBoard: give `-- --tensorboard-logdir DIR`
# (tensorboardX is installed with this package) for event files of every metric.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ARCH="" DATA_BIN="" SAVE_DIR="" MAX_UPDATE="" SRC="" TGT="" SEED=1
GPUS=0 CPU=0 NODES=1 NODE_RANK=0 MASTER_ADDR="" MASTER_PORT="" EFF_TOKENS="" PRECISION=auto DRY_RUN=0
EXTRA=()
while (( $# )); do
    case "$1" in
        --arch) need_value "$1" $#; ARCH="$2"; shift 2 ;;
        --data-bin) need_value "$1" $#; DATA_BIN="$2"; shift 2 ;;
        --save-dir) need_value "$1" $#; SAVE_DIR="$2"; shift 2 ;;
        --max-update) need_value "$1" $#; MAX_UPDATE="$2"; shift 2 ;;
        --src) need_value "$1" $#; SRC="$2"; shift 2 ;;
        --tgt) need_value "$1" $#; TGT="$2"; shift 2 ;;
        --seed) need_value "$1" $#; SEED="$2"; shift 2 ;;
        --gpus) need_value "$1" $#; GPUS="$2"; shift 2 ;;
        --cpu) CPU=1; shift ;;
        --nodes) need_value "$1" $#; NODES="$2"; shift 2 ;;
        --node-rank) need_value "$1" $#; NODE_RANK="$2"; shift 2 ;;
        --master-addr) need_value "$1" $#; MASTER_ADDR="$2"; shift 2 ;;
        --master-port) need_value "$1" $#; MASTER_PORT="$2"; shift 2 ;;
        --effective-tokens) need_value "$1" $#; EFF_TOKENS="$2"; shift 2 ;;
        --precision) need_value "$1" $#; PRECISION="$2"; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        --) shift; EXTRA=("$@"); break ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option '$1' (see '${PROG} --help'; fairseq-train options go after --)" ;;
    esac
done

# ---- validate (cheap checks first; the hardware check imports torch, the
# architecture check fairseq)
require_value --arch "$ARCH"
require_value --data-bin "$DATA_BIN"
require_value --save-dir "$SAVE_DIR"
require_value --max-update "$MAX_UPDATE"
require_value --src "$SRC"
require_value --tgt "$TGT"
require_lang --src "$SRC"
require_lang --tgt "$TGT"
require_int --max-update "$MAX_UPDATE" 1
require_int --seed "$SEED" 0
require_int --gpus "$GPUS" 0
GPUS=$((10#$GPUS))
require_int --nodes "$NODES" 1
NODES=$((10#$NODES))
require_int --node-rank "$NODE_RANK" 0
NODE_RANK=$((10#$NODE_RANK))
(( NODE_RANK < NODES )) || die "--node-rank: expected 0 .. $((NODES - 1)) (--nodes $NODES), got $NODE_RANK"
if [[ -n "$MASTER_PORT" ]]; then
    require_int --master-port "$MASTER_PORT" 1
    (( 10#$MASTER_PORT <= 65535 )) || die "--master-port: expected a TCP port 1 .. 65535, got '$MASTER_PORT'"
fi
if [[ -n "$MASTER_ADDR" ]]; then
    [[ "$MASTER_ADDR" =~ ^[A-Za-z0-9._:-]+$ ]] || die "--master-addr: expected a host name or IP address, got '$MASTER_ADDR'"
fi
if (( NODES > 1 )); then
    (( GPUS >= 1 )) || die "--nodes $NODES: expected --gpus N (processes per node, >= 1) for a multi-node run"
    [[ -n "$MASTER_ADDR" ]] || die "--nodes $NODES: expected --master-addr HOST (the address of node 0, reachable from every node)"
fi
require_choice --precision "$PRECISION" auto fp32 fp16 bf16
if [[ -n "$EFF_TOKENS" ]]; then
    require_int --effective-tokens "$EFF_TOKENS" 1
    EFF_TOKENS=$((10#$EFF_TOKENS))
fi
# What EXTRA says about batch size and precision (the last occurrence wins in fairseq).
MAX_TOKENS=4096 EXTRA_UPDATE_FREQ="" EXTRA_PRECISION=""
for (( i = 0; i < ${#EXTRA[@]}; i++ )); do
    a="${EXTRA[i]}"
    case "$a" in
        --max-tokens) MAX_TOKENS="${EXTRA[i+1]:-}" ;;
        --max-tokens=*) MAX_TOKENS="${a#*=}" ;;
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
    [[ "$PRECISION" == fp16 || "$PRECISION" == bf16 ]] && die "--precision $PRECISION: not possible with --cpu \
(fairseq trains in fp16 only on CUDA GPUs, in bf16 only on TPUs); expected --precision fp32 or auto"
    [[ -z "$EXTRA_PRECISION" ]] || die "$EXTRA_PRECISION (after --): not possible with --cpu \
(fairseq trains in fp16 only on CUDA GPUs, in bf16 only on TPUs)"
fi
require_pair "$DATA_BIN" "$SRC" "$TGT" train valid
[[ ! -e "$SAVE_DIR" || -d "$SAVE_DIR" ]] || die "--save-dir: '$SAVE_DIR' exists and is not a directory"

# The hardware: CUDA devices, compute capability of the first, bf16 support (fairseq
# 0.12's --bf16 means training on TPUs through torch_xla).
N_CUDA=0 CC_MAJOR=0 BF16_OK=0
if (( ! CPU )); then
    read -r N_CUDA CC_MAJOR BF16_OK < <("$PY" -c '
import torch
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
cc = torch.cuda.get_device_capability(0)[0] if n else 0
import importlib.util
bf = int(importlib.util.find_spec("torch_xla") is not None)
print(n, cc, bf)' 2>/dev/null || echo "0 0 0")
    if (( GPUS > 0 && N_CUDA < GPUS )); then
        die "--gpus $GPUS: this machine has $N_CUDA CUDA GPU(s); expected --gpus <= $N_CUDA \
(or --cpu to run $GPUS processes on the CPU)"
    fi
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
        (( BF16_OK )) || die "--precision bf16: fairseq 0.12 trains in bf16 only on TPUs (its --bf16 implies --tpu) \
and torch_xla is not installed; expected --precision fp16 (CUDA GPUs), fp32 or auto"
        PRECISION_ARGS=(--bf16) ;;
    fp32) ;;
esac
case "$EXTRA_PRECISION" in
    --bf16|--memory-efficient-bf16)
        (( BF16_OK )) || die "$EXTRA_PRECISION (after --): fairseq 0.12 trains in bf16 only on TPUs (it implies \
--tpu) and torch_xla is not installed" ;;
    ?*)
        (( ON_GPU )) || die "$EXTRA_PRECISION (after --): needs a CUDA GPU and this machine has none" ;;
esac

USER_DIR="$(user_dir)"
check_arch "$ARCH"

# ---- the command
WORLD=1
(( GPUS > 0 )) && WORLD=$(( GPUS * NODES ))
DEVICE_ARGS=()
(( CPU )) && DEVICE_ARGS+=(--cpu)
if (( WORLD > 1 )); then
    if (( ON_GPU )); then backend=nccl; else backend=gloo; fi
    DEVICE_ARGS+=(--distributed-world-size "$WORLD" --distributed-backend "$backend")
elif (( GPUS == 1 )); then
    DEVICE_ARGS+=(--distributed-world-size 1)  # one GPU even where more are visible
fi
BATCH_ARGS=()
if [[ -n "$EFF_TOKENS" ]]; then
    per_update=$(( 10#$MAX_TOKENS * WORLD ))
    UPDATE_FREQ=$(( (EFF_TOKENS + per_update - 1) / per_update ))
    BATCH_ARGS=(--update-freq "$UPDATE_FREQ")
    echo "${PROG}: --effective-tokens $EFF_TOKENS: --update-freq $UPDATE_FREQ = ceil($EFF_TOKENS / ($MAX_TOKENS max tokens x $WORLD process(es))), at most $(( per_update * UPDATE_FREQ )) tokens per update" >&2
fi
if [[ -n "$EXTRA_PRECISION" ]]; then
    echo "${PROG}: precision: $EXTRA_PRECISION (from the arguments after --)" >&2
else
    if (( ON_GPU )); then
        hw="$N_CUDA CUDA GPU(s), compute capability $CC_MAJOR.x"
    elif [[ "${PRECISION_ARGS[*]:-}" == --bf16 ]]; then
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
    --optimizer adam --adam-betas '(0.9,0.98)' --clip-norm 0.0 --lr 5e-4
    --lr-scheduler inverse_sqrt --warmup-updates 4000 --dropout 0.3
    --weight-decay 0.0001 --criterion label_smoothed_cross_entropy
    --label-smoothing 0.1 --max-tokens 4096 --log-format json --log-interval 100
    --seed "$SEED" --max-update "$MAX_UPDATE" --save-dir "$SAVE_DIR"
    "${DEVICE_ARGS[@]}" "${PRECISION_ARGS[@]}" "${BATCH_ARGS[@]}"
    "${EXTRA[@]}")
if (( WORLD > 1 )); then
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
fi

if (( DRY_RUN )); then
    printf -v quoted ' %q' "${CMD[@]}"
    echo "${PROG}: dry run, not training:${quoted}"
    exit 0
fi
if [[ -f "$SAVE_DIR/checkpoint_last.pt" ]]; then
    echo "${PROG}: resuming from $SAVE_DIR/checkpoint_last.pt" >&2
fi

# ---- work
run "${CMD[@]}"
