"""The compute model: kernel specs, the registry, the planner and the runner."""
