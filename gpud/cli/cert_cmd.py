"""``gpud cert``: a cluster CA and the certificates it signs, for TLS between the controller, nodes and gpuctl."""

from __future__ import annotations

import argparse
import sys

EPILOG = """examples:
  gpud cert ca /etc/gpud/tls
  gpud cert issue --ca /etc/gpud/tls --name controller --host ctl.example --host 10.0.0.5
  gpud cert issue --ca ./tls --name controller --host 127.0.0.1 --host localhost

`gpud cert ca DIR` writes DIR/ca.pem (the CA certificate: copy it to every
node and to users; node.toml's ca_file, client.toml's ca or GPUD_CA name it)
and DIR/ca.key (mode 0600: keep it on the host that issues certificates).
`gpud cert issue` writes NAME.pem (the certificate, then the CA's) and
NAME.key (mode 0600) next to the CA, or in --out; name every address and
DNS name clients use to reach the controller with --host. controller.toml's
[tls] cert and key name them. Nothing is ever overwritten.
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``gpud cert`` with its ``ca`` and ``issue`` verbs."""
    parser = subparsers.add_parser(
        "cert", help="make a cluster CA and certificates for TLS", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Make a certificate authority for the cluster, and certificates it signs for the controller.")
    verbs = parser.add_subparsers(title="verbs", metavar="VERB", required=True)
    ca = verbs.add_parser("ca", help="make a new CA in DIR (ca.pem, ca.key)", epilog=EPILOG,
                          formatter_class=argparse.RawDescriptionHelpFormatter,
                          description="Make a new certificate authority: DIR/ca.pem and DIR/ca.key (mode 0600).")
    ca.add_argument("dir", metavar="DIR", help="where to write ca.pem and ca.key (made if missing)")
    ca.add_argument("--days", type=int, default=3650, help="how long the CA is valid (default 3650 days)")
    ca.add_argument("--common-name", default="gpud cluster CA", metavar="TEXT", help="the CA's name")
    ca.set_defaults(func=run_ca)
    issue = verbs.add_parser("issue", help="issue a certificate signed by the CA", epilog=EPILOG,
                             formatter_class=argparse.RawDescriptionHelpFormatter,
                             description="Issue NAME.pem and NAME.key (mode 0600), signed by the CA in --ca, "
                                         "valid for every --host.")
    issue.add_argument("--ca", required=True, metavar="DIR", help="the CA's directory (from gpud cert ca)")
    issue.add_argument("--name", required=True, help="the certificate's name, and its files' (e.g. controller)")
    issue.add_argument("--host", action="append", default=[], metavar="HOST", required=True,
                       help="an IP address or DNS name clients connect to; repeat for each")
    issue.add_argument("--out", metavar="DIR", help="where to write the files (default: the CA's directory)")
    issue.add_argument("--days", type=int, default=825, help="how long it is valid (default 825 days)")
    issue.set_defaults(func=run_issue)


def _days(days: int) -> int:
    from gpud.certs import CertError
    if days < 1:
        raise CertError(f"--days must be at least 1 (got {days})")
    return days


def run_ca(args: argparse.Namespace) -> int:
    """Make the CA and say where its files are; exit 1 with the reason when it cannot."""
    from gpud.certs import CertError, make_ca
    try:
        made = make_ca(args.dir, args.common_name, _days(args.days))
    except CertError as exc:
        print(f"gpud cert ca: {exc}", file=sys.stderr)
        return 1
    print(f"gpud cert ca: wrote {made.cert} (give it to nodes and users) and {made.key} (mode 0600, keep it "
          f"private); valid until {made.not_after:%Y-%m-%d}")
    return 0


def run_issue(args: argparse.Namespace) -> int:
    """Issue the certificate and say where its files are; exit 1 with the reason when it cannot."""
    from gpud.certs import CertError, issue
    try:
        made = issue(args.ca, args.name, args.host, args.out, _days(args.days))
    except CertError as exc:
        print(f"gpud cert issue: {exc}", file=sys.stderr)
        return 1
    print(f"gpud cert issue: wrote {made.cert} and {made.key} (mode 0600) for {', '.join(made.hosts)}; "
          f"valid until {made.not_after:%Y-%m-%d}")
    return 0
