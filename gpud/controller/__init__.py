"""The controller daemon: the one source of truth for jobs, nodes and policy, around the scheduling core."""
