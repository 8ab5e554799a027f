#!/usr/bin/env python3
"""Run ``fairseq-localness-report`` (fairseq_localness/cli/report.py) without importing
fairseq, as scripts/results.py runs ``fairseq-localness-results``: the page needs the
standard library and matplotlib only. Used by the reproduce drivers
(scripts/reproduce/common.sh) and scripts/demo.sh; arguments as the console script's.
"""
import sys

from results import load_module

if __name__ == "__main__":
    sys.exit(load_module("fairseq_localness.cli.report").cli_main())
