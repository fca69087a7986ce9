"""The tests' throwaway PostgreSQL server: gpud/testing/pg_server.py, shared with the benchmarks."""

from gpud.testing.pg_server import Server, bin_dir

__all__ = ["Server", "bin_dir"]
