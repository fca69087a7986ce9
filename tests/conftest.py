"""Fixtures shared by many test files: one throwaway PostgreSQL server per session, started only when asked for."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def pg_server():
    """A running PostgreSQL server for the whole session (tests/pg_server.py), stopped and removed at the end."""
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
