"""Machine profiles, the cost and memory model, calibration, and the plan search.

The entry point is `search.make_plan(network, ...)`, which returns a `plan.Plan`.
"""
