"""Running the pipeline's jobs on a SLURM cluster, through submitit.

The reproduce drivers (scripts/reproduce/*.sh --slurm) and scripts/train.sh --slurm write
a job graph and hand it to this package, which submits it at once with SLURM
dependencies and returns; --status and --cancel read what it recorded. See
docs/slurm.md.

    python -m fairseq_localness.slurm submit --graph FILE --state-dir DIR [options] [--dry-run]
    python -m fairseq_localness.slurm status --graph FILE --state-dir DIR
    python -m fairseq_localness.slurm cancel --graph FILE --state-dir DIR
    python -m fairseq_localness.slurm busy --state-dir DIR < ROWS   (a local run's check)

(scripts/slurm.py runs the same without importing fairseq: the drivers and train.sh
call it, so that a refusal that asks the cluster comes within seconds.)

The graph (tab-separated lines, written by scripts/reproduce/slurm.sh):

    ROW  <row> <seed> <run dir> <score file> <dataset>
    JOB  <key> <kind> <row> <seed> <nodes> <tasks per node> <gpus per node> <keys it needs, space-separated>
    CMD  <key> <a shell command, quoted for bash>

kind: prepare (a dataset's data, once), train (one row and seed: nodes x tasks, one
fairseq-train per task, started by fairseq from SLURM's environment), eval (average,
decode, score), final (the significance tests and the table, after every evaluation,
whatever became of it). A train job is checkpointable: when SLURM warns it of its time
limit or of a preemption (SIGUSR2, --signal-delay seconds ahead), submitit requeues it,
and a job requeued by anyone (scontrol requeue, a node failure) runs its command again,
which resumes from the row's checkpoint_last.pt (train.sh). Requeues are counted
(SLURM_RESTART_COUNT) and bounded (--max-requeues).

Every job records its state in DIR/jobs/<key>.json (running, done, failed with its
log's last line); DIR/submitted.json maps each key to its job id and log; DIR/rows.tsv
holds the ROW lines of every submission from DIR (the table job's rows).
What a job is now is read from SLURM's queue once per command (cluster.read_queue),
checked: a failing, silent or garbled squeue stops the command before anything is
submitted, cancelled or written. A job's log
is DIR/logs/<job id>_<task>_log.err: its commands' output and errors (fairseq's
progress, "Loaded checkpoint ... (epoch E @ U updates)" after a requeue, distributed
init), submitit's and SLURM's messages.

The modules: graph (the graph file read into jobs), jobs (what runs in a job, pickled
by submitit), cluster (SLURM's commands and partitions, each job's state), submit,
status (--status and --cancel), __main__ (the command line).
"""

import re

PROG = "slurm"


class UsageError(Exception):
    """A bad input: printed as 'PROG: error: MESSAGE', exit status 2, nothing submitted."""


class SlurmError(Exception):
    """SLURM failed or answered what cannot be read (squeue, sbatch, scancel): printed as
    'PROG: error: MESSAGE', exit status 1, nothing more submitted, cancelled or written."""


# sbatch's options that the graph sets itself: the resources through the driver's own
# options; the rest through submitit (the log files and their mode, the warning signal,
# the job's name, its wckey, the script that runs the step) and the graph (dependencies,
# tasks, GPUs, requeueing); a job run from another directory would not find the graph's
# relative paths (chdir), and sbatch's --parsable, --wait and --test-only change what
# submitit reads back. --slurm-arg cannot give them.
SET_BY_OPTION = ("partition", "nodes", "gpus-per-node", "cpus-per-task", "mem", "time", "account", "qos",
                 "constraint")
SET_BY_GRAPH = ("signal", "dependency", "kill-on-invalid-dep", "open-mode", "output", "error", "wrap", "chdir",
                "job-name", "array", "ntasks", "ntasks-per-node", "requeue", "no-requeue", "gpus", "gpus-per-task",
                "mem-per-cpu", "mem-per-gpu", "wckey", "parsable", "wait", "test-only",
                # synonyms and neighbours of those: sbatch's --tasks-per-node is --ntasks-per-node; GPUs
                # through --gres or per GPU would contradict the graph's; --clusters would submit where
                # squeue, which follows the run's jobs, does not look
                "tasks-per-node", "gres", "ntasks-per-gpu", "cpus-per-gpu", "clusters")


# characters that end or bend a line of a job's script (a value of an sbatch option is one line)
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")


def check_slurm_arg(arg):
    """--slurm-arg KEY=VALUE checked: an sbatch option by its long name, none that the graph sets
    (nor an abbreviation of one: sbatch reads a unique prefix as the option), the value on one line."""
    key, eq, value = arg.partition("=")
    if not (eq and re.fullmatch(r"[a-z][a-z0-9-]*", key)):
        raise UsageError(f"--slurm-arg: expected KEY=VALUE with an sbatch option's long name as KEY "
                         f"(e.g. exclude=node7, mail-type=END), got {arg!r}")
    if CONTROL_CHARACTERS.search(value):
        raise UsageError(f"--slurm-arg {key}=...: expected a value on one line, without control characters, "
                         f"got {value!r}")
    for name in SET_BY_OPTION + SET_BY_GRAPH:
        if name.startswith(key):
            by = f"--{name}" if name in SET_BY_OPTION else "the job graph itself"
            read = "" if name == key else f" (sbatch reads '{key}' as --{name})"
            raise UsageError(f"--slurm-arg {key}=...: sbatch's --{name} is set by {by}{read}; expected another "
                             f"sbatch option (not: {' '.join(SET_BY_OPTION + SET_BY_GRAPH)})")
