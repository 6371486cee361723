"""Diffract's core: compute (specs, registry, planner, execution) and storage."""
