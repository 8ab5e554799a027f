"""The job graph a driver or train.sh writes (the format: the package's docstring), as jobs."""
import os
import re

from fairseq_localness.atomic import write_text
from fairseq_localness.slurm import UsageError


class Job:
    def __init__(self, key, kind, row, seed, nodes, tasks, gpus, needs):
        self.key, self.kind, self.row, self.seed = key, kind, row, seed
        self.nodes, self.tasks, self.gpus = int(nodes), int(tasks), int(gpus)
        self.needs = needs.split()
        self.commands = []


# the fields of each kind of line of a graph, its tag included
FIELDS = {"ROW": 6, "JOB": 9, "CMD": 3}


def read_graph(path):
    """(rows, jobs): rows a list of (row, seed, run dir, score file, dataset); jobs a dict key -> Job,
    in the order of the file (each job after the jobs it needs)."""
    rows, jobs = [], {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.rstrip("\n").split("\t")
            if fields[0] in FIELDS and len(fields) != FIELDS[fields[0]]:
                raise UsageError(f"{path}:{number}: a {fields[0]} line of {len(fields)} tab-separated fields, "
                                 f"expected {FIELDS[fields[0]]}: a tab in a path, a name or a command (the graph "
                                 "separates its fields by tabs); expected none")
            if fields[0] == "ROW":
                if tuple(fields[1:]) not in rows:
                    rows.append(tuple(fields[1:]))
            elif fields[0] == "JOB":
                if fields[1] not in jobs:
                    jobs[fields[1]] = Job(*fields[1:9])
            elif fields[0] == "CMD":
                jobs[fields[1]].commands.append(fields[2])
    for job in jobs.values():
        job.needs = [k for k in job.needs if k in jobs]
    return rows, {k: j for k, j in jobs.items() if j.commands}


def safe(key):
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", key)


def rows_path(state_dir):
    return os.path.join(state_dir, "rows.tsv")


def read_rows(state_dir):
    """The rows of every submission from a state directory (rows.tsv: the graphs' ROW lines),
    each (row, seed, run dir, score file, dataset) once."""
    rows = []
    try:
        with open(rows_path(state_dir), encoding="utf-8") as f:
            for line in f:
                fields = tuple(line.rstrip("\n").split("\t")[1:])
                if len(fields) == 5 and fields not in rows:
                    rows.append(fields)
    except FileNotFoundError:
        pass
    return rows


def write_rows(state_dir, rows):
    """rows.tsv with the rows it holds and these, each once."""
    known = read_rows(state_dir)
    rows = known + [r for r in rows if r not in known]
    write_text(rows_path(state_dir), "".join("ROW\t" + "\t".join(r) + "\n" for r in rows))
