"""Probes the runner points at a live trial: stacks (py-spy) and process CPU time.

Each probe degrades to a one-line reason when its evidence is unavailable; none raises.
"""
