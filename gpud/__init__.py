"""gpud: a Slurm-style batch scheduler for shared GPU servers on bare metal."""

__version__ = "0.1.0"

__all__ = ["__version__", "hookimpl"]


def __getattr__(name: str):
    """``gpud.hookimpl`` marks a function as an implementation of a gpud hook (``@hookimpl``).

    It is made on first use: importing pluggy would cost every gpuctl call
    about 15 ms that it never needs.
    """
    if name == "hookimpl":
        import pluggy
        marker = pluggy.HookimplMarker("gpud")
        globals()["hookimpl"] = marker
        return marker
    raise AttributeError(f"module 'gpud' has no attribute {name!r}")
