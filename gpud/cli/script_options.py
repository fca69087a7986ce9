"""The options a batch script sets for itself: its ``#SBATCH`` lines, translated, then its ``#GPUD`` lines."""

from __future__ import annotations

import os
import sys

from gpud.cli.common import UsageError

TYPE_CHECKING = False  # argparse is imported only for a line the quick reader leaves to it
if TYPE_CHECKING:
    import argparse

    from gpud.cli.options import Namespace
    from gpud.directives import Directive

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


def script_options(text: str, source: str, job_name: str | None, command_line: tuple[str, ...] = (),
                   prog: str = "gpuctl submit") -> argparse.Namespace | Namespace:
    """The options a script's own lines set: ``#SBATCH`` translated, overridden by ``#GPUD``.

    ``command_line`` holds sbatch options given on an sbatch command line,
    which win over the script's ``#SBATCH`` lines. Prints one warning on
    stderr (headed ``prog``) for every option gpud does not act on. Raises
    UsageError naming the script and the line of a bad option.
    """
    from gpud.directives import Directive, DirectiveError, read_directives
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
        return _job_options(translated + read_directives(text, source), source)
    except DirectiveError as exc:
        raise UsageError(str(exc)) from None


def _job_options(directives: list[Directive], source: str) -> argparse.Namespace | Namespace:
    """The job options the directives set, later lines winning: read quickly when every line is plain, else by
    argparse (``parse_directives``), whose message names the line and what is wrong with it."""
    from gpud.cli.options import Namespace
    from gpud.cli.submit_cmd import JOB_OPTIONS, directive_parser
    from gpud.directives import parse_directives
    namespace = Namespace()
    for directive in directives:
        if JOB_OPTIONS.quick_parse(list(directive.args), namespace) is None:
            return parse_directives(directive_parser(), directives, source)
    return namespace


def _user() -> str | None:
    import pwd
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return None
