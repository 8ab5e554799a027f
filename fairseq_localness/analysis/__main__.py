"""``python -m fairseq_localness.analysis <tool> [args]`` (also the console script
``fairseq-localness-analysis``): run one analysis tool."""
import importlib
import sys

from fairseq_localness.analysis import TOOLS, __doc__ as PACKAGE_DOC
from fairseq_localness.analysis.cli_args import logger, setup_logging

USAGE = "usage: fairseq-localness-analysis TOOL [options]   (TOOL --help for its options)\n\n"


def cli_main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        # the help text is the command's output (stdout, like argparse's --help), an
        # error without a tool goes to stderr
        (sys.stdout if argv else sys.stderr).write(USAGE + PACKAGE_DOC + "\n")
        return 0 if argv else 2
    tool = argv[0].replace("-", "_")
    if tool not in TOOLS:
        setup_logging()
        logger.error("fairseq-localness-analysis: unknown tool %r; allowed: %s", argv[0], ", ".join(TOOLS))
        return 2
    module = importlib.import_module(f"fairseq_localness.analysis.{tool}")
    module.cli_main(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
