"""Command-line entry points: ``gpud`` for daemons and admins, ``gpuctl`` for users."""
