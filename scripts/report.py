#!/usr/bin/env python3
"""Run ``fairseq-localness-report`` (fairseq_localness/cli/report.py) without importing
fairseq, as scripts/results.py runs ``fairseq-localness-results``: the page needs the
standard library and matplotlib only. Used by the reproduce drivers
(scripts/reproduce/common.sh) and scripts/demo.sh; arguments as the console script's.
"""
import sys

from results import import_without_models

if __name__ == "__main__":
    sys.exit(import_without_models("fairseq_localness.cli.report").cli_main())
