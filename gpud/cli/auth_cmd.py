"""``gpuctl token create|list|revoke`` and ``gpuctl whoami``: credentials."""

from __future__ import annotations

import argparse

from gpud.cli import render
from gpud.cli.common import UsageError, client, print_json
from gpud.cli.parsing import add_verb

TOKEN_DESCRIPTION = """\
Make an API token for a user (admins only). The token is printed once; the
controller keeps only its hash. The user puts it in GPUD_TOKEN or in
~/.config/gpud/client.toml (token = "...").

The token's jobs run as its user, and never as root (uid 0) unless the
token is made with --allow-root.
"""

LIST_DESCRIPTION = """List the tokens the controller accepts (admins only): each one's id (the
start of its hash; the token itself is never kept), user, whether it is an
admin token and may run jobs as root, and when it was made.
"""

REVOKE_DESCRIPTION = """Revoke tokens (admins only): one by the id `gpuctl token list` shows, or
every token of a user with --user. A revoked token is refused from then on.
The last admin token cannot be revoked: make another one first.
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
    create.add_argument("--allow-root", action="store_true",
                        help="the token's jobs may run as root when its user is root (uid 0)")
    add_verb(verbs, "list", help="list the tokens in use", description=LIST_DESCRIPTION,
             examples="  gpuctl token list\n  gpuctl token list --json\n", func=run_token_list, json_flag=True)
    revoke = add_verb(verbs, "revoke", help="revoke a token, or every token of a user",
                      description=REVOKE_DESCRIPTION,
                      examples="  gpuctl token revoke 3f2a9c01b7de\n  gpuctl token revoke --user alice\n",
                      func=run_token_revoke, json_flag=True)
    revoke.add_argument("id", nargs="?", help="the token's id, as gpuctl token list shows it")
    revoke.add_argument("--user", help="revoke every token of this user")
    token.set_defaults(help_of=token)
    whoami = add_verb(subparsers, "whoami", help="who the controller thinks you are",
                      description="Print the user your token speaks for, and whether it is an admin.",
                      examples="  gpuctl whoami\n  GPUD_TOKEN=$(cat admin.token) gpuctl whoami\n",
                      func=run_whoami, json_flag=True)
    del whoami


def run_token_create(args: argparse.Namespace) -> int:
    """Create a token and print it."""
    body = {"user": args.user, "admin": args.admin}
    if args.allow_root:
        body["allow_root"] = True
    answer = client().post("tokens", body)
    if args.json:
        print_json(answer)
    else:
        print(answer["token"])
    return 0


def token_rows(tokens: list[dict]) -> str:
    """Tokens as a table for people; when each was made, with its date (tokens live for months)."""
    return render.table(("ID", "USER", "ADMIN", "ALLOW-ROOT", "CREATED"),
                        [(t["id"], t["user"], "yes" if t["admin"] else "no", "yes" if t["allow_root"] else "no",
                          render.stamp(t["created"])) for t in tokens])


def run_token_list(args: argparse.Namespace) -> int:
    """List the tokens in use."""
    answer = client().get("tokens")
    if args.json:
        print_json(answer)
    else:
        print(token_rows(answer["tokens"]))
    return 0


def run_token_revoke(args: argparse.Namespace) -> int:
    """Revoke one token by id, or every token of a user; exit 2 when neither or both are given."""
    if (args.id is None) == (args.user is None):
        raise UsageError("give a token id (from gpuctl token list) or --user NAME, one of them")
    answer = client().post("tokens/revoke", {"id": args.id} if args.id is not None else {"user": args.user})
    if args.json:
        print_json(answer)
    else:
        for token in answer["revoked"]:
            print(f"revoked token {token['id']} of {token['user']}")
    return 0


def run_whoami(args: argparse.Namespace) -> int:
    """Print the caller's user name (and "admin")."""
    answer = client().get("whoami")
    if args.json:
        print_json(answer)
    else:
        print(f"{answer.get('user')}{' (admin)' if answer.get('admin') else ''}")
    return 0
