"""Settings every test shares.

Hypothesis times each example against a 200 ms deadline unless a test says otherwise; on a loaded host (CI
runs the suite twice, the machine may run other work) one slow example then fails a pure property by chance.
How fast things run is measured by bench/, never by a unit test, so no property has a deadline.
"""

from hypothesis import settings

settings.register_profile("gpud", deadline=None)
settings.load_profile("gpud")
