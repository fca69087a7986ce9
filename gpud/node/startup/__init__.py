"""The startup hook directory put first on PYTHONPATH of tasks with a GPU memory slice."""
