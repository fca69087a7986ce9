"""Python source of the programs the tests' tasks and jobs run (``[sys.executable, "-c", source]``)."""

from __future__ import annotations

# Waits until a signal ends it (a task that runs until stopped), without waking.
FOREVER = "import signal\nwhile True: signal.pause()\n"


def until_exists(path: str) -> str:
    """Source that waits until the file ``path`` exists: the test makes it to let the program go on."""
    return f"import os, time\nwhile not os.path.exists({path!r}): time.sleep(0.02)\n"
