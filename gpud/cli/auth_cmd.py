"""``gpuctl token create`` and ``gpuctl whoami``: credentials."""

from __future__ import annotations

import argparse

from gpud.cli.common import add_verb, client, print_json

TOKEN_DESCRIPTION = """\
Make an API token for a user (admins only). The token is printed once; the
controller keeps only its hash. The user puts it in GPUD_TOKEN or in
~/.config/gpud/client.toml (token = "...").
"""


def add_parsers(subparsers) -> None:
    """Register ``token`` and ``whoami`` on the gpuctl sub-command parser."""
    token = subparsers.add_parser("token", help="API tokens (admin)", description="API tokens.")
    verbs = token.add_subparsers(title="commands", metavar="COMMAND")
    create = add_verb(verbs, "create", help="make a token for a user", description=TOKEN_DESCRIPTION,
                      examples="  gpuctl token create --user alice\n  gpuctl token create --user bob --admin\n"
                               "  gpuctl token create --user ci --json | jq -r .token > ci.token\n",
                      func=run_token_create, json_flag=True)
    create.add_argument("--user", required=True, help="the user the token speaks for")
    create.add_argument("--admin", action="store_true", help="an admin token (every verb, every job)")
    token.set_defaults(help_of=token)
    whoami = add_verb(subparsers, "whoami", help="who the controller thinks you are",
                      description="Print the user your token speaks for, and whether it is an admin.",
                      examples="  gpuctl whoami\n  GPUD_TOKEN=$(cat admin.token) gpuctl whoami\n",
                      func=run_whoami, json_flag=True)
    del whoami


def run_token_create(args: argparse.Namespace) -> int:
    """Create a token and print it."""
    answer = client().post("tokens", {"user": args.user, "admin": args.admin})
    if args.json:
        print_json(answer)
    else:
        print(answer["token"])
    return 0


def run_whoami(args: argparse.Namespace) -> int:
    """Print the caller's user name (and "admin")."""
    answer = client().get("whoami")
    if args.json:
        print_json(answer)
    else:
        print(f"{answer.get('user')}{' (admin)' if answer.get('admin') else ''}")
    return 0
