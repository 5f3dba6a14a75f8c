"""The network model, machine profiles, cost and memory model, and the plan search."""

from znni.planner.network import LayerShape, LayerSpec, Network, load_network

__all__ = ["LayerShape", "LayerSpec", "Network", "load_network"]
