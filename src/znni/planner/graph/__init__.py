"""The graph planner: a CPU primitive per conv node of a graph network, and per window a
predicted time and peak memory.

It prices nodes with the sequential planner's cost model (`planner.costs`, `planner.memory`)
over the same calibrated machine rates; they never import it.
`search.plan_graph` is the entry point; `*_costs` price the primitives only graphs use;
`calibrate` fits their rates.
"""
