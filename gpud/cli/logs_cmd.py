"""``gpuctl logs``: a job's output, or its error stream, optionally followed while it runs."""

from __future__ import annotations

import argparse
import sys

from gpud.cli.common import UsageError, client
from gpud.cli.parsing import add_verb

DESCRIPTION = """\
Print what a job's task wrote to its output file (or its error file with
--err), as the node holding it reads it. With -f, keep printing as the job
writes, until it ends (or Ctrl-C); a job still pending is followed from
when it starts. Each task of a gang writes its own file (gpud-%j.%t.out by
default): --task N prints rank N's. An array id prints the output of each
of its jobs under a ==> 42_7 <== line.
"""

EXAMPLES = """\
  gpuctl logs 42
  gpuctl logs 42 -f
  gpuctl logs 42 --err --task 3       # task 3 of a gang
  gpuctl logs 42_7 | tail -n 50       # element 7 of array job 42
  gpuctl logs 42                      # array job 42: every element's output, one after the other
"""


def add_parsers(subparsers) -> None:
    """Register ``logs`` on the gpuctl sub-command parser."""
    parser = add_verb(subparsers, "logs", help="print a job's output", description=DESCRIPTION,
                      examples=EXAMPLES, func=run)
    parser.add_argument("job", help="job id")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing while the job runs")
    parser.add_argument("--err", action="store_true", help="the error stream instead of the output")
    parser.add_argument("--task", type=int, metavar="N", help="which task of a gang (default 0)")
    parser.add_argument("--offset", type=int, default=0, metavar="BYTES", help="start this far into the file")


def run(args: argparse.Namespace) -> int:
    """Copy the log's bytes to stdout as they arrive."""
    from gpud.client import job_path
    if args.task is not None and args.task < 0 or args.offset < 0:
        raise UsageError("--task and --offset cannot be negative")
    query = {"stream": "err" if args.err else "out", "offset": args.offset, "follow": args.follow,
             "task": args.task}
    out = sys.stdout.buffer
    try:
        for chunk in client().stream(job_path(args.job, "logs"), query):
            out.write(chunk)
            if args.follow:
                out.flush()
    except KeyboardInterrupt:
        return 130
    out.flush()
    return 0
