"""Settings and fixtures shared by many test files.

Hypothesis times each example against a 200 ms deadline unless a test says otherwise; on a loaded host (CI
runs the suite twice, the machine may run other work) one slow example then fails a pure property by chance.
How fast things run is measured by bench/, never by a unit test, so no property has a deadline.

One throwaway PostgreSQL server per session is started only when a test asks for it.
"""

from __future__ import annotations

import pytest
from hypothesis import settings

settings.register_profile("gpud", deadline=None)
settings.load_profile("gpud")


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
