"""python -m fairseq_localness.slurm submit|check|status|cancel|busy: the command line (the
package's docstring describes it). --status and --cancel take the submission's options
too (the submitted command with --status appended), and leave them aside."""
import argparse
import sys

from fairseq_localness import slurm
from fairseq_localness.slurm import PROG, SlurmError, UsageError
from fairseq_localness.slurm.status import busy, cancel, status
from fairseq_localness.slurm.submit import check, submit


def add_resources(s):
    s.add_argument("--partition")
    s.add_argument("--nodes", type=int, default=1)
    s.add_argument("--gpus-per-node", type=int, default=1)
    s.add_argument("--cpus-per-task", type=int)
    s.add_argument("--mem")
    s.add_argument("--time")
    s.add_argument("--account")
    s.add_argument("--qos")
    s.add_argument("--constraint")
    s.add_argument("--max-running", type=int)
    s.add_argument("--max-requeues", type=int, default=3)
    s.add_argument("--signal-delay", type=int, default=90)
    s.add_argument("--slurm-arg", action="append", default=[])
    s.add_argument("--max-jobs", type=int, default=500)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fairseq_localness.slurm", description=slurm.__doc__.split("\n")[0])
    p.add_argument("--prog", default=PROG)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("submit")
    c = sub.add_parser("check")
    s.add_argument("--graph", required=True)
    s.add_argument("--state-dir", required=True)
    s.add_argument("--dry-run", action="store_true")
    for s in (s, c):
        add_resources(s)
    for name in ("status", "cancel", "busy"):
        q = sub.add_parser(name)
        if name != "busy":
            q.add_argument("--graph", required=True)  # the rows and seeds they read or cancel
            add_resources(q)  # (the submission's, left aside)
        q.add_argument("--state-dir", required=True)
    args = p.parse_args(argv)
    try:
        {"submit": submit, "status": status, "cancel": cancel, "check": check, "busy": busy}[args.cmd](args)
    except UsageError as e:
        print(f"{args.prog}: error: {e}", file=sys.stderr)
        return 2
    except SlurmError as e:
        print(f"{args.prog}: error: {e}", file=sys.stderr)
        return 1
    return 0


sys.exit(main())
