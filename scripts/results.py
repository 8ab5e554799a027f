#!/usr/bin/env python3
"""Run ``fairseq-localness-results`` (fairseq_localness/cli/results.py) without
importing fairseq.

The console script imports the ``fairseq_localness`` package, whose ``__init__``
registers the models and so imports fairseq (several seconds); the results tool needs
none of it (its modules import the standard library, numpy and sacrebleu). This makes
the installed package's directory importable without running its ``__init__`` and
runs the same ``cli_main``. Used by the reproduce drivers (scripts/reproduce/common.sh,
``--seeds``), whose dry runs stay fast; arguments as the console script's.
"""
import importlib
import importlib.util
import sys


def import_without_models(name="fairseq_localness.cli.results"):
    """Import ``name`` from the installed fairseq_localness without running the
    package's ``__init__`` (scripts/report.py and scripts/slurm.py load their modules so
    too)."""
    if "fairseq_localness" not in sys.modules:
        spec = importlib.util.find_spec("fairseq_localness")  # finds it without importing it
        if spec is None or not spec.submodule_search_locations:
            sys.exit(f"fairseq_localness is not installed for {sys.executable}: run make install")
        # the package object with its search path, its __init__ not executed: submodules
        # (cli.results, analysis.logs, corpus) import from it as usual
        sys.modules["fairseq_localness"] = importlib.util.module_from_spec(spec)
    return importlib.import_module(name)


if __name__ == "__main__":
    sys.exit(import_without_models().cli_main())
