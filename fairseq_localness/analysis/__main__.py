"""``python -m fairseq_localness.analysis <tool> [args]`` (also the console script
``fairseq-localness-analysis``): run one analysis tool."""
import importlib
import sys

from fairseq_localness.analysis import TOOLS, __doc__ as PACKAGE_DOC


def cli_main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: fairseq-localness-analysis TOOL [options]   (TOOL --help for its options)\n")
        print(PACKAGE_DOC)
        return 0 if argv else 2
    tool = argv[0].replace("-", "_")
    if tool not in TOOLS:
        print(f"fairseq-localness-analysis: unknown tool {argv[0]!r}; allowed: {', '.join(TOOLS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"fairseq_localness.analysis.{tool}")
    module.cli_main(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
