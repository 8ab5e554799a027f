#!/usr/bin/env python3
"""Run ``python -m fairseq_localness.slurm`` (fairseq_localness/slurm/) without importing
fairseq: the package's ``__init__`` registers the models (torch, fairseq: several
seconds), which submitting, --status, --cancel and the checks against the cluster do not
need; the jobs import the package as usual where they run. Used by the reproduce drivers
(scripts/reproduce/slurm.sh) and train.sh --slurm; arguments as the module's."""
import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import import_without_models  # noqa: E402

if __name__ == "__main__":
    import_without_models("fairseq_localness.slurm")
    runpy.run_module("fairseq_localness.slurm", run_name="__main__", alter_sys=True)
