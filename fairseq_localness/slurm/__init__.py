"""Running the pipeline's jobs on a SLURM cluster, through submitit.

The reproduce drivers (scripts/reproduce/*.sh --slurm) and scripts/train.sh --slurm write
a job graph and hand it to this package, which submits it at once with SLURM
dependencies and returns; --status and --cancel read what it recorded. See
docs/slurm.md.

    python -m fairseq_localness.slurm submit --graph FILE --state-dir DIR [options] [--dry-run]
    python -m fairseq_localness.slurm status --graph FILE --state-dir DIR
    python -m fairseq_localness.slurm cancel --state-dir DIR

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
log's last line); DIR/submitted.json maps each key to its job id and log. A job's log
is DIR/logs/<job id>_<task>_log.err: its commands' output and errors (fairseq's
progress, "Loaded checkpoint ... (epoch E @ U updates)" after a requeue, distributed
init), submitit's and SLURM's messages.

The modules: graph (the graph file read into jobs), jobs (what runs in a job, pickled
by submitit), cluster (SLURM's commands and partitions, each job's state), submit,
status (--status and --cancel), __main__ (the command line).
"""

PROG = "slurm"


class UsageError(Exception):
    """A bad input: printed as 'PROG: error: MESSAGE', exit status 2, nothing submitted."""
