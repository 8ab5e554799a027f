#!/usr/bin/env python3
"""Run ``fairseq-localness-prepare`` (fairseq_localness/data/prepare.py) without
importing fairseq.

The console script imports the ``fairseq_localness`` package, which registers the
models and so imports fairseq (several seconds); the data package needs none of it.
This loads ``fairseq_localness/data`` on its own, from wherever the installed package
is, and runs the same ``main``. Used by prepare_data.sh; arguments as the console
script's.
"""
import importlib.util
import os
import sys


def load_data_package():
    spec = importlib.util.find_spec("fairseq_localness")  # finds it without importing it
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"fairseq_localness is not installed for {sys.executable}: run make install")
    pkg_dir = os.path.join(list(spec.submodule_search_locations)[0], "data")
    name = "fairseq_localness_data"
    data_spec = importlib.util.spec_from_file_location(
        name, os.path.join(pkg_dir, "__init__.py"), submodule_search_locations=[pkg_dir])
    module = importlib.util.module_from_spec(data_spec)
    sys.modules[name] = module
    data_spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    load_data_package()
    prepare = importlib.import_module("fairseq_localness_data.prepare")
    sys.exit(prepare.main())
