"""sacct's -S/-E times as Slurm reads them, and the window they select."""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from gpud.cli.slurm.when import slurm_time
from gpuctl_helpers import stand_in  # noqa: F401  (a fixture)


@pytest.fixture(autouse=True)
def berlin(monkeypatch):
    """Local time is a zone with an offset and daylight saving, so local and UTC readings differ."""
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def local(*parts: int) -> float:
    return datetime(*parts).timestamp()


# Now is Sunday 2026-11-29 10:30 local time. Each expected time: seconds from now, or local date and time.
NOW = (2026, 11, 29, 10, 30, 0)


@pytest.mark.parametrize("text, expected", [
    ("now", 0), ("NOW", 0), ("now-1hour", -3600), ("now-90", -90), ("now+2min", 120),
    ("now-3days", -3 * 86400), ("now-1w", -7 * 86400), ("now-2h", -7200),
    ("today", (2026, 11, 29)), ("midnight", (2026, 11, 29)),
    # A time of day later than now is yesterday's, as sacct reads it.
    ("noon", (2026, 11, 28, 12)), ("09:15", (2026, 11, 29, 9, 15)),
    ("14:00:30", (2026, 11, 28, 14, 0, 30)), ("9:15am", (2026, 11, 29, 9, 15)),
    ("1:00pm", (2026, 11, 28, 13)), ("12:05am", (2026, 11, 29, 0, 5)), ("teatime", (2026, 11, 28, 16)),
    ("2026-11-01", (2026, 11, 1)), ("2026-07-01T14:30", (2026, 7, 1, 14, 30)),
    ("2026-07-01T14:30:15", (2026, 7, 1, 14, 30, 15)),
    # A date without a year is the latest one not in the future.
    ("11/01", (2026, 11, 1)), ("12/24", (2025, 12, 24)), ("1101", (2026, 11, 1)),
    ("11.01.25", (2025, 11, 1)), ("110125", (2025, 11, 1)), ("11/01-08:00", (2026, 11, 1, 8)),
])
def test_times_read_as_sacct_reads_them(text, expected):
    now = local(*NOW)
    assert slurm_time(text, now) == (now + expected if isinstance(expected, int) else local(*expected))


@pytest.mark.parametrize("text", ["yesterday", "now-1fortnight", "25:00", "13:00pm", "2026-02-30", "13/01",
                                  "now-", "2026-11-01T", "", "11/01/2026x"])
def test_a_time_sacct_would_refuse_is_refused_with_its_text(text):
    with pytest.raises(ValueError, match="invalid time specification") as refused:
        slurm_time(text, local(*NOW))
    assert repr(text) in str(refused.value)


def test_sacct_lists_the_jobs_of_its_window(monkeypatch, capsys, tmp_path, stand_in):  # noqa: F811
    from gpud.cli.slurm.jobs import sacct
    monkeypatch.setenv("GPUD_URL", stand_in.url)
    monkeypatch.setenv("GPUD_TOKEN", "tok")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    now = time.time()
    midnight = slurm_time("today", now)
    jobs = [{"id": "1", "user": "ann", "state": "COMPLETED", "submitted": midnight - 7200, "ended": midnight - 3600},
            {"id": "2", "user": "ann", "state": "COMPLETED", "submitted": midnight - 7200, "ended": midnight + 1},
            {"id": "3", "user": "ann", "state": "RUNNING", "submitted": midnight - 86400 * 3, "ended": None},
            {"id": "4", "user": "ann", "state": "FAILED", "submitted": now - 5, "ended": now - 1}]
    stand_in.routes["GET /api/v1/whoami"] = (200, {"user": "ann"}, {})
    stand_in.routes["GET /api/v1/jobs"] = (200, {"jobs": jobs, "arrays": {}, "next_cursor": None}, {})

    def ids(*argv: str) -> list[str]:
        assert sacct(["-n", "-X", "-P", "-o", "JobID", *argv]) == 0
        return capsys.readouterr().out.split()

    # By default, today's: what ended before midnight is left out, what ran past it or still runs is in.
    assert ids() == ["2", "3", "4"]
    assert ids("-S", "now-2days") == ["1", "2", "3", "4"]
    assert ids("-S", "now-2days", "-E", "now-1hour") == ["1", "2", "3"]
    assert ids("-s", "COMPLETED") == ["1", "2"]  # a state, and no -S: no start either, as Slurm's sacct
    assert ids("-S", "2000-01-01", "-E", "2000-01-02") == []
    with pytest.raises(ValueError, match="'last tuesday'"):
        sacct(["-S", "last tuesday"])
