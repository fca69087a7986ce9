"""The options a batch script sets for itself: its ``#SBATCH`` lines, translated, then its ``#GPUD`` lines."""

from __future__ import annotations

import argparse
import os
import sys

from gpud.cli.common import UsageError

# What each kind of ignored #SBATCH option is told, with {detail} from the translation.
WHY = {
    "unsupported": "gpud has no such option",
    "exclusive": "a job is not given whole nodes, only what it asks for (--gres, -c, --mem)",
    "open_mode": "gpud always appends to output files",
    "other_gres": "only gpu is read from --gres, not {detail}",
    "ntasks_per_node": "tasks per node that do not divide the job ({detail}) run as one task per node; "
                       "start more processes per node in the script",
    "mem_all": "gpud cannot give a job all of a node's memory; the default --mem applies",
    "unlimited_time": "no time limit is set (the policy's, if any, applies)",
    "partitions": "a job has one pool; it goes to {detail}",
    "dependency_kind": "{detail} is not a gpud dependency (afterok, afterany, afternotok)",
    "dependency_any": "'?' (any of) is read as ',' (all of)",
    "pattern": "{detail} is not expanded (%j, %t, %x, %u and %A_%a are)",
}


def script_options(parser: argparse.ArgumentParser, text: str, source: str,
                   job_name: str | None, command_line: tuple[str, ...] = (),
                   prog: str = "gpuctl submit") -> argparse.Namespace:
    """The options a script's own lines set: ``#SBATCH`` translated, overridden by ``#GPUD``.

    ``command_line`` holds sbatch options given on an sbatch command line,
    which win over the script's ``#SBATCH`` lines. Prints one warning on
    stderr (headed ``prog``) for every option gpud does not act on. Raises
    UsageError naming the script and the line of a bad option.
    """
    from gpud.directives import Directive, DirectiveError, parse_directives, read_directives
    try:
        translated = []
        sbatch = read_directives(text, source, prefix="#SBATCH")
        if command_line:
            sbatch.append(Directive(0, command_line))
        if sbatch:
            from gpud.sbatch import translate
            user = _user()
            try:
                translation = translate(sbatch, job_name, user)
            except DirectiveError as exc:
                text = str(exc)
                if text.startswith("line 0: #SBATCH "):  # the options given on sbatch's command line
                    raise DirectiveError(f"command line: {text.removeprefix('line 0: #SBATCH ')}") from None
                raise DirectiveError(f"{source}, {text}") from None
            translated = translation.directives
            for item in translation.ignored:
                where = f"{source}, line {item.line}: #SBATCH" if item.line else "command line:"
                print(f"{prog}: warning: {where} {item.option} ignored: "
                      f"{WHY[item.why].format(detail=item.detail)}", file=sys.stderr)
        return parse_directives(parser, translated + read_directives(text, source), source)
    except DirectiveError as exc:
        raise UsageError(str(exc)) from None


def _user() -> str | None:
    import pwd
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return None
