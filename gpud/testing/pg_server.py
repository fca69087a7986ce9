"""A throwaway PostgreSQL server for tests and benchmarks: initdb into a temporary directory, 127.0.0.1 on a free port.

PostgreSQL refuses to run as root, so when this runs as root the server
runs as ``nobody``. One server serves a whole test session; each test gets
a database of its own (:meth:`Server.database`), dropped afterwards. With
``ssl_cert`` and ``ssl_key`` (made by `gpud cert issue`) it serves TLS too
(``ssl = on``), as a production server would; plain connections are still
allowed, so the tests can see what a client's ``sslmode`` demands.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time

BIN_GLOBS = ("/usr/lib/postgresql/*/bin",)
_names = itertools.count()


def bin_dir() -> str | None:
    """The directory holding initdb and postgres: on PATH, else Debian's versioned directory; None when absent."""
    found = shutil.which("initdb")
    if found:
        return os.path.dirname(found)
    dirs = sorted(d for pattern in BIN_GLOBS for d in glob.glob(pattern) if os.path.exists(os.path.join(d, "initdb")))
    return dirs[-1] if dirs else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One running PostgreSQL server; :meth:`stop` ends it (by its pid) and removes its files."""

    def __init__(self, ssl_cert: str | None = None, ssl_key: str | None = None, durable: bool = False) -> None:
        bindir = bin_dir()
        if bindir is None:
            raise RuntimeError("PostgreSQL is not installed (no initdb): apt-get install postgresql")
        self.root = tempfile.mkdtemp(prefix="gpud-pg-")
        os.chmod(self.root, 0o755)
        self.data = os.path.join(self.root, "data")
        self.user = None if os.getuid() != 0 else pwd.getpwnam("nobody")
        if self.user is not None:
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
        self.port = _free_port()
        kwargs: dict = {"user": self.user.pw_uid, "group": self.user.pw_gid} if self.user else {}
        subprocess.run([os.path.join(bindir, "initdb"), "-D", self.data, "-U", "gpud", "--auth=trust",
                        "-E", "UTF8", "--locale=C.UTF-8" if _has_c_utf8() else "--locale=C"],
                       check=True, capture_output=True, cwd=self.root, **kwargs)
        ssl = self._ssl_options(ssl_cert, ssl_key) if ssl_cert and ssl_key else []
        # fsync off: the server is thrown away with the test run, and the tests kill controllers, not it.
        # A benchmark asks for ``durable``: every commit fsync'd, as a production server (and SQLite's
        # synchronous=full) does, so the two stores are compared on the same promise.
        unsafe = [] if durable else ["-c", "fsync=off", "-c", "full_page_writes=off"]
        self.log = open(os.path.join(self.root, "server.log"), "wb")
        self.proc = subprocess.Popen(
            [os.path.join(bindir, "postgres"), "-D", self.data, "-h", "127.0.0.1", "-p", str(self.port),
             "-k", self.root, *unsafe, "-c", "max_connections=200", *ssl],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=self.root, **kwargs)
        self.url = f"postgresql://gpud@127.0.0.1:{self.port}/postgres"
        deadline = time.monotonic() + 60
        import psycopg
        while True:
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("the test PostgreSQL server did not start") from None
                time.sleep(0.1)

    def _ssl_options(self, cert: str, key: str) -> list[str]:
        """Copy the certificate and key into the data directory, owned by the server's user (PostgreSQL refuses
        a key that others can read), and the settings that turn TLS on."""
        options = ["-c", "ssl=on"]
        for source, name, setting in ((cert, "server.crt", "ssl_cert_file"), (key, "server.key", "ssl_key_file")):
            path = os.path.join(self.data, name)
            shutil.copyfile(source, path)
            os.chmod(path, 0o600)
            if self.user is not None:
                os.chown(path, self.user.pw_uid, self.user.pw_gid)
            options += ["-c", f"{setting}={path}"]
        return options

    def database(self) -> str:
        """A new, empty database; its URL."""
        import psycopg
        name = f"t{os.getpid()}_{next(_names)}"
        with psycopg.connect(self.url, autocommit=True) as db:
            db.execute(f"CREATE DATABASE {name}")
        return f"postgresql://gpud@127.0.0.1:{self.port}/{name}"

    def drop(self, url: str) -> None:
        """Drop the database at ``url``, ending whatever is still connected to it."""
        import psycopg
        name = url.rsplit("/", 1)[1]
        with psycopg.connect(self.url, autocommit=True) as db:
            db.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        """Stop the server (a fast shutdown, then SIGKILL) and remove its directory."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)


def _has_c_utf8() -> bool:
    try:
        out = subprocess.run(["locale", "-a"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return False
    return any(line.lower() in ("c.utf8", "c.utf-8") for line in out.split())
