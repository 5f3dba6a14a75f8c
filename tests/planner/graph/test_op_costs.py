"""The graph planner's costs of graph_ops' general convs: what they count, not how fast
anything runs (no timings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from znni.model.loading import load_model
from znni.planner.graph.op_costs import phase_split_conv, strided_geometry
from znni.planner.graph.search import fast_conv, plan_graph
from znni.planner.machine import MachineProfile

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def unet(tmp_path_factory):
    from monai.networks.nets import UNet

    torch.manual_seed(0)
    net = UNet(spatial_dims=3, in_channels=1, out_channels=2, channels=(4, 8, 16),
               strides=(2, 2), num_res_units=2, norm="batch").eval()
    path = Path(tmp_path_factory.mktemp("goc")) / "unet.onnx"
    torch.onnx.export(net, (torch.zeros(1, 1, 16, 16, 16),), path, input_names=["x"],
                      dynamo=False, dynamic_axes={"x": {2: "z", 3: "y", 4: "x"}})
    return load_model(path)


def test_strided_convs_carry_their_phase_split_workspace(unet) -> None:
    graph = unet.graph((24, 24, 24))
    plan = plan_graph(graph, MachineProfile.load("ci-2core"))
    strided = [(n, p) for n, p in zip(graph.nodes, plan.nodes, strict=True)
               if n.op == "conv" and not fast_conv(n)]
    assert strided and all(phase_split_conv(n) and p.workspace_bytes > 0 for n, p in strided)
    first = strided[0][0]  # 1 -> 4 channels, 3^3 stride 2 on 24^3: 12^3 outputs
    split, grid, rows = strided_geometry(graph, first)
    assert (split, grid, rows) == (1 * 8 * 14 * 13 * 13, 12 * 13 * 13, 27)
    assert plan.peak_bytes >= graph.peak_tensor_bytes() + max(p.workspace_bytes for _, p in strided)



def test_scatter_transposed_convs_carry_their_uncropped_output(unet) -> None:
    """k=3, s=2 upsamplings add into an uncropped output (2n+1 per axis) and slab products
    of K*Cout rows; run alone (no pool below 4 MiB), one slab product at a time."""
    from znni.planner.graph.op_costs import scatter_transpose_bytes, upsample_transpose

    graph = unet.graph((24, 24, 24))
    plan = plan_graph(graph, MachineProfile.load("ci-2core"))
    scatter = [(n, p) for n, p in zip(graph.nodes, plan.nodes, strict=True)
               if n.op == "conv_transpose" and not upsample_transpose(n)]
    assert scatter and all(p.workspace_bytes > 0 for _, p in scatter)
    node = scatter[-1][0]  # the last upsampling: 12^3 -> 24^3
    n, cin, *size = graph.shapes[node.inputs[0]]
    cout = node.params["weight"].shape[1]
    assert size == [12, 12, 12]
    acc = cout * 25**3 * 4
    planes = 27 * cout * 12 * 12 * 4 * 12  # every z plane fits one 4 MiB slab
    assert scatter_transpose_bytes(graph, node, 2) == acc + planes
