"""What runs in a job: its commands, one after the other, in every task; the job's
state recorded for --status. submitit pickles these steps when they are submitted and
runs them on the cluster's nodes."""
import json
import os
import signal
import subprocess
import sys
import time

from fairseq_localness.atomic import write_text
from fairseq_localness.slurm.cluster import load_json
from fairseq_localness.slurm.graph import read_rows, safe


def _last_line(path):
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f.read().splitlines()[-200:] if line.strip()]
    except OSError:
        return ""
    lines = [line for line in lines if not line.startswith("submitit ")]
    return lines[-1] if lines else ""


class Step:
    """A job's commands (bash), one after the other; the job fails at the first that fails.
    Run by submitit in every task of the job (train jobs: one per process); the job's state
    is written by task 0."""

    def __init__(self, key, commands, state_dir, max_requeues=0):
        self.key, self.commands, self.state_dir, self.max_requeues = key, commands, state_dir, max_requeues

    def _write(self, **state):
        if int(os.environ.get("SLURM_PROCID", "0")) != 0 and state.get("state") != "failed":
            return  # (task 0 writes the job's state; any task its failure)
        path = os.path.join(self.state_dir, "jobs", safe(self.key) + ".json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        state.update(job_id=os.environ.get("SLURM_JOB_ID", ""), restarts=int(os.environ.get("SLURM_RESTART_COUNT", "0")),
                     time=time.time())
        if state.get("state") == "running":
            before = load_json(path)
            if before.get("state") == "failed" and (before.get("job_id"), before.get("restarts")) == \
                    (state["job_id"], state["restarts"]):
                return  # (another task of this run of the job failed first: its message stays)
        write_text(path, json.dumps(state))

    def __call__(self):
        import submitit

        log = str(submitit.JobEnvironment().paths.stderr)
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        if restarts > self.max_requeues:
            message = (f"requeued {restarts} times, more than --max-requeues {self.max_requeues}; "
                       f"submit again to go on from the last checkpoint")
            self._write(state="failed", message=message, log=log)
            raise RuntimeError(message)
        self._write(state="running", log=log)
        if restarts:
            print(f"{self.key}: requeued ({restarts} of at most {self.max_requeues}); the command resumes from "
                  "the last checkpoint", file=sys.stderr, flush=True)
        stopping = []
        # SLURM stops a job it requeues or cancels with SIGTERM (then SIGKILL): the command
        # ends, and this task waits to be stopped instead of reporting a failure
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
        for cmd in self.commands:
            print("+ " + cmd, file=sys.stderr, flush=True)
            # (its output in the job's one log: fairseq logs to stdout, "Loaded checkpoint ..." included)
            child = subprocess.Popen(["bash", "-c", cmd], start_new_session=True, stdout=sys.stderr,
                                     preexec_fn=lambda: signal.signal(signal.SIGUSR2, signal.SIG_IGN))
            try:
                rc = child.wait()
            finally:  # (submitit's requeue on SIGUSR2 leaves through here)
                if child.poll() is None:
                    os.killpg(child.pid, signal.SIGTERM)
                    try:
                        child.wait(30)
                    except subprocess.TimeoutExpired:
                        os.killpg(child.pid, signal.SIGKILL)
            if rc != 0:
                if stopping:  # stopped by SLURM (a requeue, a cancel, another task's failure)
                    time.sleep(60)  # (SLURM's SIGKILL usually comes first)
                    raise RuntimeError(f"{self.key}: stopped by SLURM (SIGTERM)")
                sys.stderr.flush()
                message = _last_line(log) or f"exit status {rc}"
                self._write(state="failed", message=f"exit status {rc}: {message}", log=log)
                raise RuntimeError(f"{self.key}: '{cmd}' failed with exit status {rc}: {message}")
        self._write(state="done", log=log)
        return "done"


try:  # the train jobs are checkpointable: requeued with the same command on a timeout or preemption
    from submitit.helpers import Checkpointable
except ImportError:  # (submitit is only needed where jobs are submitted or run)
    Checkpointable = object


class TrainStep(Step, Checkpointable):
    """A row's training: on SIGUSR2 (time limit or preemption) submitit calls checkpoint(),
    which requeues this same step: train.sh resumes from the row's last checkpoint."""

    def checkpoint(self, *args, **kwargs):
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


class FinalStep(Step):
    """The significance tests and the table: the commands that can run (a test whose rows
    failed is left out), each row without results marked failed (RUN/FAILED) first: the
    rows of every submission from the state directory (rows.tsv)."""

    def __init__(self, key, commands, state_dir, table_command):
        super().__init__(key, commands, state_dir)
        self.table_command = table_command

    def __call__(self):
        self._write(state="running")  # (a table job killed before its end is failed, not cancelled)
        registry = load_json(os.path.join(self.state_dir, "submitted.json"))
        for row, seed, run_dir, score, _ in read_rows(self.state_dir):
            failed = os.path.join(run_dir, "FAILED")
            if os.path.exists(score):
                if os.path.exists(failed):
                    os.remove(failed)
                continue
            reasons, unfinished = [], ""
            for kind in ("prepare", "train", "eval"):
                for key, rec in registry.items():
                    if rec.get("kind") != kind or (kind != "prepare" and (rec["row"], rec["seed"]) != (row, seed)):
                        continue
                    st = load_json(os.path.join(self.state_dir, "jobs", safe(key) + ".json"))
                    if st.get("state") == "failed" and st.get("job_id") == rec["job_id"]:
                        reasons.append(f"{kind} job {rec['job_id']}: {st.get('message', '')}")
                    elif st.get("job_id") != rec["job_id"] or st.get("state") != "done":
                        unfinished = unfinished or f"{kind} job {rec['job_id']} (log {rec['log']})"
            os.makedirs(run_dir, exist_ok=True)
            with open(failed, "w") as f:
                f.write((reasons[0] if reasons else f"no results: {unfinished or 'a job it needed'} failed or was "
                         "cancelled") + "\n")
        ok = True
        for cmd in self.commands:
            print("+ " + cmd, file=sys.stderr, flush=True)
            if subprocess.run(["bash", "-c", cmd], stdout=sys.stderr).returncode != 0:
                ok = False  # a test of a failed row: the table says it
        print("+ " + self.table_command, file=sys.stderr, flush=True)
        rc = subprocess.run(["bash", "-c", self.table_command], stdout=sys.stderr).returncode
        self._write(state="done" if rc == 0 else "failed", message="" if rc == 0 else f"the table: exit status {rc}")
        if rc:
            raise RuntimeError(f"the table failed (exit status {rc})")
        return "done" if ok else "done (some tests could not run)"
