"""``python -m fairseq_localness.corpus``: the same as ``fairseq-localness-corpus``."""
import sys

from fairseq_localness.corpus.cli import cli_main

sys.exit(cli_main())
