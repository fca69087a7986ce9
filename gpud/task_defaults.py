"""Defaults a task runs with when neither its job nor the policy says otherwise (shared by controller and node)."""

# The most processes and threads one task may have at once (its pids cgroup's pids.max): far above what a
# training job with its data loaders forks, far below the host's pid space, so a fork bomb stays in its task.
DEFAULT_TASK_PIDS_MAX = 8192
