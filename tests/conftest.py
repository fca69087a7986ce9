"""Settings and fixtures shared by many test files.

Hypothesis times each example against a 200 ms deadline unless a test says otherwise; on a loaded host (CI
runs the suite twice, the machine may run other work) one slow example then fails a pure property by chance.
How fast things run is measured by bench/, never by a unit test, so no property has a deadline.

One throwaway PostgreSQL server per session is started only when a test asks for it.

The fixtures that build a cluster: ``live_cluster`` starts real daemons (tests/e2e only),
``local_controller`` serves a controller in this process with a fake clock and cycles run on demand
(tests/in_process.py). The builders of scheduling scenarios are in tests/sched_helpers.py.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sys

# The daemons and gpuctl calls the tests start import gpud afresh hundreds of times, and each worker rewrites
# the same test modules: where the environment turns Python's bytecode cache off (PYTHONDONTWRITEBYTECODE), the
# suite turns it back on for itself and every program it starts, so each module is compiled once. The workers
# are started after this file is read, and inherit it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

import pytest
from hypothesis import settings

from daemons import POLICY, running_cluster
from in_process import close, open_controller

# CI (CI set, as .ci/run runs) tries each property's full number of examples; a developer's run of the README's
# test command a quarter of it (tests/hypothesis_budget.py). HYPOTHESIS_PROFILE=ci asks for the full number here.
# A shell starts a background job with SIGINT ignored, and the programs tests start inherit that: gpuctl would
# then never see the Ctrl-C a test sends it. Tests start their programs as a terminal would.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

settings.register_profile("ci", deadline=None, max_examples=100)
settings.register_profile("dev", deadline=None, max_examples=25)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE")
                      or ("ci" if os.environ.get("CI", "").lower() not in ("", "0", "false") else "dev"))


@pytest.fixture(scope="session")
def pg_server():
    """A running PostgreSQL server for the whole session (gpud/testing/pg_server.py), stopped and removed at the end."""
    from pg_server import Server, bin_dir
    if bin_dir() is None:
        pytest.skip("PostgreSQL is not installed (.ci/run installs it)")
    server = Server()
    yield server
    server.stop()


@pytest.fixture
def pg_url(pg_server):
    """The URL of a new, empty database on the session's server, dropped after the test."""
    url = pg_server.database()
    yield url
    pg_server.drop(url)


@pytest.fixture
def live_cluster(tmp_path):
    """Starts real clusters: ``live_cluster(policy=POLICY, nodes={"n1": 4}, **options)`` returns a started
    :class:`daemons.LiveCluster`; every process of every cluster is stopped by pid after the test."""
    numbers = itertools.count(1)
    with contextlib.ExitStack() as stack:
        def start(policy: str = POLICY, nodes: dict[str, int] | None = None, **options):
            root = tmp_path / f"cluster{next(numbers)}"
            root.mkdir()
            return stack.enter_context(running_cluster(root, policy, nodes, **options))
        yield start


@pytest.fixture
async def local_controller(tmp_path):
    """A controller in this process on a fresh state directory (the tests' policy), closed after the test."""
    controller = await open_controller(tmp_path / "controller")
    yield controller
    await close(controller)
