"""fairseq-localness-report: the command line of :mod:`fairseq_localness.report`.

    fairseq-localness-report WORK [--out FILE]
    fairseq-localness-report WORK --record-run --command CMD --driver NAME [--title T]
        [--devices TEXT] [--driver-path PATH] [--table-args ARGS]

The second form is the drivers' (scripts/reproduce/common.sh, scripts/demo.sh): it
writes WORK/run.json when a run starts (the command, the commit, the start time, the
hardware) for the page's "The run".
"""
import argparse
import sys

PROG = "fairseq-localness-report"


def get_parser():
    from fairseq_localness import report

    p = argparse.ArgumentParser(prog=PROG, description=report.__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="The page: python -m pydoc fairseq_localness.report")
    p.add_argument("work", metavar="WORK", help="a reproduce driver's --work-dir, or the demo's (runs/demo)")
    p.add_argument("--out", default=None, metavar="FILE", help="the page (default: WORK/report.html)")
    p.add_argument("--driver", default=None, help="the driver's name, e.g. dc_table1 (default: WORK/run.json's)")
    r = p.add_argument_group("recording a run's start (the drivers)")
    r.add_argument("--record-run", action="store_true", help="write WORK/run.json and no page")
    r.add_argument("--command", default="", help="the command of the run")
    r.add_argument("--title", default="", help="the table's title")
    r.add_argument("--devices", default="", help="what the run trains on, in words (e.g. '8 GPU(s)')")
    r.add_argument("--driver-path", default="", help="the driver script (for the page's commands)")
    r.add_argument("--table-args", default="", help="the options --table needs, shell-quoted")
    return p


def cli_main(argv=None):
    from fairseq_localness.report import ReportError, record_run, write_report

    args = get_parser().parse_args(argv)
    try:
        if args.record_run:
            record_run(args.work, args.command, args.driver or "", args.title, args.devices, args.driver_path,
                       args.table_args)
            return 0
        path = write_report(args.work, args.out, args.driver)
    except ReportError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    print(f"{PROG}: wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
