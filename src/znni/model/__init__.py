"""What a network is: its layers, weights, shapes and field of view, and the spec reader.

`network.Network` is the value every later package takes; `spec` reads the JSON
sequential spec (docs/design.md, "Network spec and weights").
"""

from znni.model.network import LayerShape, Network, load_network
from znni.model.spec import LayerSpec

__all__ = ["LayerShape", "LayerSpec", "Network", "load_network"]
