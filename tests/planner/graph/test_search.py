"""The graph planner: a primitive per fast conv within the memory limit, lifetimes-based
peaks, and the window choice (costs only: nothing here is timed)."""

from __future__ import annotations

from dataclasses import replace
from math import prod
from pathlib import Path

import numpy as np
import pytest

from znni.engine.compute.graph_choice import _candidates, choose, plan_window
from znni.engine.compute.graph_forward import run_graph
from znni.model.loading import load_model
from znni.planner.costs import CPU_CONV_PRIMITIVES
from znni.planner.graph.openvino_costs import (
    OPENVINO_KEPT_PER_INPUT_BYTE,
    OPENVINO_KEPT_PER_NORMED_OUTPUT_BYTE,
    OPENVINO_RUNTIME_BYTES,
    openvino_ready,
)
from znni.planner.graph.search import (
    conv_layer,
    fast_conv,
    first_pass_seconds,
    plan_graph,
    unbuilt_concats,
    winograd_bytes,
)
from znni.planner.graph.winograd_costs import chunk_rounds_factor
from znni.planner.machine import MachineProfile
from znni.primitives.backends import make_backend

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from monai.networks.nets import BasicUNet

    torch.manual_seed(0)
    net = BasicUNet(spatial_dims=3, in_channels=1, out_channels=2,
                    features=(8, 8, 16, 16, 32, 8)).eval()
    path = Path(tmp_path_factory.mktemp("gs")) / "bu.onnx"
    torch.onnx.export(net, (torch.zeros(1, 1, 32, 32, 32),), path, input_names=["x"],
                      dynamo=False, dynamic_axes={"x": {2: "z", 3: "y", 4: "x"}})
    return load_model(path)


@pytest.mark.parametrize("openvino_rate", [None, 1e15])  # 1e15: OpenVINO where it can run
def test_every_fast_conv_gets_a_primitive_and_the_peak_counts_lifetimes(
    model, openvino_rate, monkeypatch
) -> None:
    machine = MachineProfile.load("ci-2core")
    # no channels-last hand-on and no chains here (their bytes are checked in their tests)
    monkeypatch.setattr("znni.planner.graph.openvino_costs.channels_last_convs", lambda *a: frozenset())
    monkeypatch.setattr("znni.planner.graph.openvino_costs.openvino_chains", lambda *a: {})
    if openvino_rate is not None:  # and its copies and calls free: every conv on it
        monkeypatch.setattr("znni.planner.graph.openvino_costs.OPENVINO_COPY_PASSES", 0.0)
        monkeypatch.setattr("znni.planner.graph.openvino_costs.OPENVINO_NORM_PASSES", 0.0)
        monkeypatch.setattr("znni.planner.graph.openvino_costs.OPENVINO_CALL_S", 0.0)
        machine = replace(machine, cpu_rates={**machine.cpu_rates,
                                              "openvino_flops_per_s": openvino_rate})
    graph = model.graph((32, 32, 32))
    plan = plan_graph(graph, machine)
    if openvino_rate is not None and openvino_ready():
        assert sum(p.primitive == "openvino" for p in plan.nodes) >= 10
    for i, (node, p) in enumerate(zip(graph.nodes, plan.nodes, strict=True)):
        assert (p.primitive in (*CPU_CONV_PRIMITIVES, "openvino", "winograd")) == fast_conv(node)
        # an OpenVINO conv applies the instance norm after it: the norm costs nothing
        absorbed = node.op == "instance_norm" and plan.nodes[i - 1].primitive == "openvino"
        assert (p.predicted_s == 0) == absorbed
    assert plan.predicted_window_s == pytest.approx(sum(n.predicted_s for n in plan.nodes))
    biggest = max(n.workspace_bytes for n in plan.nodes)
    kept = 0
    for i, (n, p) in enumerate(zip(graph.nodes, plan.nodes, strict=True)):
        layer = conv_layer(graph, i, n) if fast_conv(n) else None
        if p.primitive == "winograd":
            kept += winograd_bytes(layer, machine.cores)[1]
        elif p.primitive == "openvino":  # a compiled layer keeps its own buffers: the
            # blocked input, and the conv's output where its norm follows (one window's)
            after = plan.nodes[i + 1] if i + 1 < len(plan.nodes) else None
            normed = after is not None and after.op == "instance_norm" and after.predicted_s == 0
            kept += int(OPENVINO_KEPT_PER_INPUT_BYTE * layer.in_bytes
                        + OPENVINO_KEPT_PER_NORMED_OUTPUT_BYTE * layer.out_bytes * normed)
    picks = {i: (p.predicted_s, p.workspace_bytes, 0, p.primitive)
             for i, p in enumerate(plan.nodes) if p.primitive is not None}
    if any(p.primitive == "openvino" for p in plan.nodes):
        kept += OPENVINO_RUNTIME_BYTES  # its runtime, once
    tensors = graph.peak_tensor_bytes(unbuilt=unbuilt_concats(graph, picks))
    assert plan.peak_bytes == tensors + plan.spectra_bytes + kept + biggest


def test_decoder_concats_read_in_parts_take_no_buffer_and_free_their_parts(model) -> None:
    """BasicUNet(8, 8, 16, 16, 32, 8) at 32^3 with every 3^3 conv on Winograd: by hand, the
    peak is at the last decoder's first conv: the input (32^3 floats, 128 KiB, held
    through the pass), the skip and the upsampled tensor it reads in parts and its output
    (8 x 32^3 floats, 1 MiB each). Built, the concat (2 MiB) is alive beside its parts."""
    graph = model.graph((32, 32, 32))
    picks = {i: (0.0, 0, 0, "winograd") for i, n in enumerate(graph.nodes)
             if fast_conv(n) and n.params["weight"].shape[2:] == (3, 3, 3)}
    unbuilt = unbuilt_concats(graph, picks)
    assert len(unbuilt) == 4  # one per decoder level
    assert graph.peak_tensor_bytes(unbuilt=unbuilt) == 3 * 2**20 + 2**17
    assert graph.peak_tensor_bytes() == 4 * 2**20 + 2**17


def test_a_single_input_channel_conv_is_never_planned_on_winograd(model, monkeypatch) -> None:
    """Its 216 GEMMs would have depth 1, which numpy runs without BLAS; even with Winograd's
    rate made enormous, the first conv (1 -> 8) gets another primitive, the others may not."""
    monkeypatch.setattr("znni.planner.graph.search.openvino_ready", lambda: False)
    ci = MachineProfile.load("ci-2core")
    machine = replace(ci, cpu_rates={**ci.cpu_rates, "winograd_flops_per_s": 1e15})
    graph = model.graph((32, 32, 32))
    plan = plan_graph(graph, machine)
    cubic = [(n, p) for n, p in zip(graph.nodes, plan.nodes, strict=True)
             if fast_conv(n) and n.params["weight"].shape[2:] == (3, 3, 3)]
    assert cubic[0][0].params["weight"].shape[1] == 1
    assert cubic[0][1].primitive != "winograd"
    assert any(p.primitive == "winograd" for _, p in cubic[1:])


def test_a_tight_limit_drops_kept_spectra_and_then_refuses(model) -> None:
    ci = MachineProfile.load("ci-2core")  # with slow GEMMs, so FFTs (and kept spectra) win
    slow = {"direct_flops_per_s": 1e8, "openvino_flops_per_s": 1e8,
            "winograd_flops_per_s": 1e8}
    machine = replace(ci, cpu_rates={**ci.cpu_rates, **slow})
    graph = model.graph((64, 64, 64))
    roomy = plan_graph(graph, machine, 2**34)
    tensors = graph.peak_tensor_bytes()
    tight = plan_graph(graph, machine, tensors + 64 * 2**20)
    assert tight.peak_bytes <= tensors + 64 * 2**20
    assert roomy.spectra_bytes > tight.spectra_bytes  # the roomy plan keeps spectra it could not
    with pytest.raises(ValueError, match="fits in"):
        plan_graph(graph, machine, tensors // 2)


def test_the_chosen_window_is_the_fastest_that_fits(model) -> None:
    budget = 200 * 2**20
    region = (96, 96, 96)
    best = choose(model, budget, region)
    assert best.plan.peak_bytes <= budget
    for k in range(1, 6):
        window = tuple(16 * k for _ in range(3))
        try:
            other = plan_window(model, window, budget, region)
        except ValueError:
            continue
        assert other.predicted_voxels_per_second <= best.predicted_voxels_per_second
    with pytest.raises(ValueError, match="memory budget"):
        plan_window(model, (96, 96, 96), 2**20, region)


def test_the_first_pass_is_counted_once_per_run(model, monkeypatch) -> None:
    """A fresh run pays once for the pages of its peak: weighed against the passes, it
    moves a small region's choice to a window with a smaller peak when it is costly."""
    monkeypatch.setattr("znni.planner.graph.search.openvino_ready", lambda: False)
    monkeypatch.setattr("znni.planner.graph.network_costs.openvino_ready", lambda: False)
    budget, region = 2**32, (64, 64, 64)
    free = choose(model, budget, region)
    run_s = free.passes * free.plan.predicted_window_s + first_pass_seconds(free.plan)
    assert free.predicted_voxels_per_second == pytest.approx(prod(region) / run_s)
    assert _candidates(model, (256, 256, 256))[-1] == (256, 256, 256)  # up to MAX_WINDOW
    monkeypatch.setattr("znni.planner.graph.search.FIRST_PASS_S_PER_PEAK_BYTE", 1e-3)
    costly = choose(model, budget, region)
    assert costly.plan.peak_bytes < free.plan.peak_bytes and costly.window < free.window


def test_the_first_pass_pages_exclude_what_openvino_layers_keep(model) -> None:
    """OpenVINO's layers pay for their own pages in their first calls (openvino_terms), so
    the run's first pass charges the peak less what they and the runtime keep (skipped
    without OpenVINO)."""
    if not openvino_ready():
        pytest.skip("needs OpenVINO")
    from znni.planner.graph import search as graph_search

    ci = MachineProfile.load("ci-2core")
    machine = replace(ci, cpu_rates={**ci.cpu_rates, "openvino_flops_per_s": 1e15})
    plan = plan_graph(model.graph((32, 32, 32)), machine)
    assert all(n.primitive == "openvino" for n in plan.nodes if n.primitive)
    assert OPENVINO_RUNTIME_BYTES < plan.openvino_bytes < plan.peak_bytes
    own = plan.peak_bytes - plan.openvino_bytes
    assert first_pass_seconds(plan) == pytest.approx(
        graph_search.FIRST_PASS_S_PER_PEAK_BYTE * own + graph_search.OPENVINO_IMPORT_S)
    slow = replace(ci, cpu_rates={**ci.cpu_rates, "openvino_flops_per_s": 1.0})
    plain = plan_graph(model.graph((32, 32, 32)), slow)
    assert not any(n.primitive == "openvino" for n in plain.nodes)
    assert plain.openvino_bytes == 0
    assert first_pass_seconds(plain) == pytest.approx(
        graph_search.FIRST_PASS_S_PER_PEAK_BYTE * plain.peak_bytes)


def test_the_executor_runs_the_planned_primitives(model) -> None:
    graph = model.graph((16, 16, 16))
    x = np.random.default_rng(0).random((1, 1, 16, 16, 16), dtype=np.float32)
    conv = next(n.name for n in graph.nodes if fast_conv(n))
    with pytest.raises(ValueError, match="unknown CPU conv primitive 'nope'"):
        run_graph(graph, x, make_backend("cpu"), {conv: "nope"})
    ref = run_graph(graph, x, make_backend("reference"))
    from znni.primitives.cpu.openvino_conv import openvino_available

    extra = ("openvino",) if openvino_available() else ()
    for prim in (*CPU_CONV_PRIMITIVES, *extra):
        prims = {n.name: prim for n in graph.nodes if fast_conv(n)}
        got = run_graph(graph, x, make_backend("cpu"), prims)
        assert np.abs(got - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())
    for prim in ("winograd", "winograd6"):  # F(6,3) on 16^3: ragged edge tiles
        cubic = {n.name: prim for n in graph.nodes
                 if fast_conv(n) and n.params["weight"].shape[2:] == (3, 3, 3)}
        assert cubic
        got = run_graph(graph, x, make_backend("cpu"), cubic)
        assert np.abs(got - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())
    one = next(n.name for n in graph.nodes if fast_conv(n) and n.params["weight"].shape[2] == 1)
    with pytest.raises(ValueError, match="3x3x3 kernels only"):
        run_graph(graph, x, make_backend("cpu"), {one: "winograd"})


def test_f63_is_weighed_on_whole_tiles_of_long_rows_within_its_error_bound(
    model, monkeypatch
) -> None:
    """BasicUNet(8, ..) at 96^3: its 96^3 convs (16 x tiles of 6) get F(6,3), faster by the
    model; the 48^3 ones (8 x tiles), the 1-channel first conv and every conv of a 64^3
    window (ragged tiles) never; with the error bound at 0, no conv."""
    monkeypatch.setattr("znni.planner.graph.search.openvino_ready", lambda: False)
    machine = MachineProfile.load("ci-2core")

    def winograd6(window: int) -> dict[tuple[int, ...], set[str]]:
        graph = model.graph((window,) * 3)
        plan = plan_graph(graph, machine)
        seen: dict[tuple[int, ...], set[str]] = {}
        for n, p in zip(graph.nodes, plan.nodes, strict=True):
            if fast_conv(n) and n.params["weight"].shape[2:] == (3, 3, 3):
                size = graph.shapes[n.outputs[0]][2:]
                seen.setdefault(size, set()).add(f"{p.primitive}:{n.params['weight'].shape[1]}")
        return seen

    at96 = winograd6(96)
    assert at96[(96, 96, 96)] == {"direct:1", "winograd6:8", "winograd6:16"}
    assert all(not any(p.startswith("winograd6") for p in prims)
               for size, prims in at96.items() if size != (96, 96, 96))
    assert not any("winograd6" in p for prims in winograd6(64).values() for p in prims)
    monkeypatch.setattr("znni.planner.graph.winograd_costs.WINOGRAD6_MAX_TILE_ERROR", 0.0)
    assert not any("winograd6" in p for prims in winograd6(96).values() for p in prims)


def test_openvino_convs_apply_the_instance_norms_after_them(model, monkeypatch) -> None:
    """Planned on OpenVINO, every conv of BasicUNet applies its instance norm (and the
    LeakyReLU after it) in its own compiled layer: the host's norm never runs, the result
    is the reference's, and the planner charges the norm to the conv."""
    pytest.importorskip("openvino")
    from znni.engine.compute import graph_forward

    graph = model.graph((16, 16, 16))
    x = np.random.default_rng(1).random((2, 1, 16, 16, 16), dtype=np.float32)
    ref = run_graph(graph, x, make_backend("reference"))
    prims = {n.name: "openvino" for n in graph.nodes if fast_conv(n)}

    def refuse(*args: object) -> None:
        raise AssertionError("the host ran an instance norm")

    monkeypatch.setitem(graph_forward.INPLACE, "instance_norm", refuse)
    monkeypatch.setitem(graph_forward.KERNELS, "instance_norm", refuse)
    got = run_graph(graph, x, make_backend("cpu"), prims)
    assert np.abs(got - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())
    norms = sum(n.op == "instance_norm" for n in graph.nodes)
    assert norms >= 8
    with pytest.raises(AssertionError, match="host ran"):  # on Winograd the host norms run
        run_graph(graph, x, make_backend("cpu"), {k: "direct" for k in prims})

    from znni.planner.graph.openvino_costs import openvino_seconds

    machine = MachineProfile.load("ci-2core")
    i = next(i for i, n in enumerate(graph.nodes) if fast_conv(n))
    layer = conv_layer(graph, i, graph.nodes[i])
    assert openvino_seconds(layer, machine, norm=True) > openvino_seconds(layer, machine)


def test_openvino_pays_for_idle_channel_lanes_and_shares_its_first_call() -> None:
    from znni.planner.costs import LayerShape
    from znni.planner.graph.openvino_costs import openvino_seconds, openvino_terms

    ci = MachineProfile.load("ci-2core")
    machine = replace(ci, cpu_rates={**ci.cpu_rates, "memory_bytes_per_s": 1e15})

    def layer(cin: int, cout: int, k: int = 3) -> LayerShape:
        return LayerShape(0, "conv", 1, cin, (127 + k,) * 3, 1, cout, (128,) * 3, (k,) * 3)

    def per_flop(cin: int, cout: int, k: int = 3) -> float:
        shape = layer(cin, cout, k)
        return openvino_seconds(shape, machine) / shape.direct_flops

    assert per_flop(1, 16) == pytest.approx(4 * per_flop(16, 16), rel=0.05)  # 1/16 of lanes
    assert per_flop(32, 16) == pytest.approx(per_flop(16, 16), rel=0.05)
    def mac_per_flop(cin: int, cout: int, k: int = 3) -> float:  # the multiply-add term
        shape = layer(cin, cout, k)
        return openvino_terms(shape, machine)[0] / shape.direct_flops

    # fewer output channels than a block leave lanes idle where multiply-adds bound the layer
    assert mac_per_flop(16, 12) == pytest.approx(16 / 12 * mac_per_flop(16, 16))
    assert mac_per_flop(16, 24) == pytest.approx(mac_per_flop(16, 16))  # the fitted rate
    assert mac_per_flop(1, 12) == pytest.approx(mac_per_flop(1, 16))  # output-bound
    assert mac_per_flop(16, 2, 1) == pytest.approx(mac_per_flop(16, 16, 1))
    shape = layer(16, 16)
    steady, once, shared = (openvino_seconds(shape, machine, p) for p in (None, 1, 100))
    assert steady < shared < once
    assert shared - steady == pytest.approx((once - steady) / 100)


def test_a_batch_of_windows_shares_each_nodes_call_cost(model, monkeypatch) -> None:  # noqa: ANN001
    """Batch 2: twice the work and tensors, one call overhead per node; the window's share
    is half the batch's time. plan_window batches where that is BATCH_GAIN faster per window
    and the batch's peak fits, else runs one window at a time. Without OpenVINO, whose
    layers run a call per window (nothing shared) and chain at batch 1 where batch 2 may
    pick other primitives."""
    from znni.engine.compute import graph_choice
    from znni.planner.graph.search import NODE_OVERHEAD_S

    monkeypatch.setattr("znni.planner.graph.search.openvino_ready", lambda: False)

    machine = MachineProfile(name="t", cores=2, memory_bytes=2**33)
    graph = model.graph((32, 32, 32))
    one, two = (plan_graph(graph, machine, 2**31, batch=b) for b in (1, 2))
    assert (one.batch, two.batch) == (1, 2)
    assert two.peak_bytes > one.peak_bytes and two.peak_bytes >= graph.peak_tensor_bytes(2)
    overhead_s = machine.rate("layer_overhead_s")
    for i, (a, b) in enumerate(zip(one.nodes, two.nodes, strict=True)):
        if a.primitive == "winograd" and b.primitive == "winograd":
            rounds_a, rounds_b = (chunk_rounds_factor(conv_layer(graph, i, graph.nodes[i], s), 2)
                                  for s in (1, 2))
            assert rounds_b <= rounds_a  # a pair of windows fills the cores at least as well
            assert 2 * (a.predicted_s - overhead_s) / rounds_a == pytest.approx(
                (b.predicted_s - overhead_s) / rounds_b)
        elif a.primitive is None and a.op in ("maxpool", "instance_norm") and a.predicted_s:
            assert 2 * a.predicted_s - b.predicted_s >= NODE_OVERHEAD_S * 0.999
    factor = two.predicted_window_s * 2 / sum(n.predicted_s for n in two.nodes)
    assert factor == pytest.approx(one.predicted_window_s / sum(n.predicted_s for n in one.nodes))
    assert two.predicted_window_s < one.predicted_window_s

    region = (96, 96, 96)
    monkey = pytest.MonkeyPatch()
    monkey.setattr(graph_choice, "planning_machine", lambda: machine)
    try:
        roomy = plan_window(model, (32, 32, 32), 2**31, region)
        gain = 1 - two.predicted_window_s / one.predicted_window_s
        assert (roomy.plan.batch > 1) == (gain >= graph_choice.BATCH_GAIN)
        tight = graph.peak_tensor_bytes(2) - 1  # two windows' tensors alone do not fit
        lean = plan_window(model, (32, 32, 32), tight, region)
        assert lean.plan.batch == 1 and lean.plan.peak_bytes <= tight
    finally:
        monkey.undo()


def test_winograd_cost_counts_the_rounds_of_chunks_its_workers_run() -> None:
    """A layer small enough for one chunk keeps one of two cores busy: twice the time per
    unit of work of a layer whose chunks split evenly (winograd.chunks decides both)."""
    from znni.model.network import LayerShape
    from znni.planner.graph.winograd_costs import winograd_seconds
    from znni.primitives.cpu.winograd import CHUNK_BYTES, chunks

    def layer(c: int, n: int) -> LayerShape:
        return LayerShape(0, "conv", 1, c, (n + 2,) * 3, 1, c, (n,) * 3, (3, 3, 3))

    two = MachineProfile(name="t", cores=2, memory_bytes=2**33)
    one = MachineProfile(name="t", cores=1, memory_bytes=2**33)
    small, big = layer(128, 4), layer(16, 64)  # 1 tile row of 1 tile; 16 x 16 x 16 tiles
    per_chunk = CHUNK_BYTES // (4 * 216 * 256)
    assert len(chunks(1, (1, 1, 1), per_chunk, 2)) == 1
    assert chunk_rounds_factor(small, 2) == 2.0 and chunk_rounds_factor(small, 1) == 1.0
    assert chunk_rounds_factor(big, 2) == 1.0
    # 16 -> 16 channels at 20^3: 5 x 5 x 5 tiles in three chunks, two rounds on two cores
    assert len(chunks(1, (5, 5, 5), CHUNK_BYTES // (4 * 216 * 32), 2)) == 3
    assert chunk_rounds_factor(layer(16, 20), 2) == pytest.approx(4 / 3)
    overhead_s = two.rate("layer_overhead_s")
    # the same rates (those of all cores) on both profiles: on two cores the one chunk
    # leaves a core idle, so its work takes twice the time the rates say
    assert winograd_seconds(small, two) - overhead_s == pytest.approx(
        2 * (winograd_seconds(small, one) - overhead_s))
    assert winograd_seconds(big, two) == pytest.approx(winograd_seconds(big, one))


def test_a_channels_last_hand_on_is_not_charged_its_copies(model, monkeypatch) -> None:
    """An OpenVINO conv whose readers all take its output as it lies (OpenVINO convs, pools,
    a concat's parts) hands it on channels-last: its plan drops the transpose of its output
    and each OpenVINO conv reader's reorder of it, 2 x OPENVINO_COPY_PASSES x its output
    bytes each, at the memory rate; no other node changes (skipped without OpenVINO)."""
    if not openvino_ready():
        pytest.skip("needs OpenVINO")
    from znni.model.graph import reader_counts
    from znni.model.openvino_layers import channels_last_convs, openvino_output_node
    from znni.planner.graph import openvino_costs

    ci = MachineProfile.load("ci-2core")
    machine = replace(ci, cpu_rates={**ci.cpu_rates, "openvino_flops_per_s": 1e15})
    monkeypatch.setattr(openvino_costs, "OPENVINO_CALL_S", 0.0)
    graph = model.graph((32, 32, 32))
    kept = plan_graph(graph, machine)
    picked = {i: p.primitive for i, p in enumerate(kept.nodes)}
    readers = reader_counts(graph)
    chained = channels_last_convs(graph, readers, picked.get)
    assert len(chained) >= 6  # BasicUNet's conv pairs
    monkeypatch.setattr(openvino_costs, "channels_last_convs", lambda *a: frozenset())
    copied = plan_graph(graph, machine)
    for i, (a, b) in enumerate(zip(kept.nodes, copied.nodes, strict=True)):
        want = 0.0
        if i in chained:
            out = graph.nodes[openvino_output_node(graph, i, readers)].outputs[0]
            out_bytes = conv_layer(graph, i, graph.nodes[i]).out_bytes
            convs = sum(n.op == "conv" and n.inputs[0] == out for n in graph.nodes)
            want = (openvino_costs.OPENVINO_COPY_PASSES * 2 * out_bytes * (1 + convs)
                    / machine.rate("memory_bytes_per_s"))
        assert b.predicted_s - a.predicted_s == pytest.approx(want, abs=1e-12)
        assert a.workspace_bytes == (0 if i in chained else b.workspace_bytes)
    # the readers of a hand-on keep less of their input
    takers = [j for j, n in enumerate(graph.nodes) if n.op == "conv" and any(
        graph.nodes[openvino_output_node(graph, i, readers)].outputs[0] == n.inputs[0]
        for i in chained)]
    less = (openvino_costs.OPENVINO_KEPT_PER_INPUT_BYTE
            - openvino_costs.OPENVINO_KEPT_PER_CHANNELS_LAST_INPUT_BYTE)
    unkept = sum(int(less * conv_layer(graph, j, graph.nodes[j]).in_bytes) for j in takers)
    work = [max(n.workspace_bytes for n in plan.nodes) for plan in (kept, copied)]
    assert copied.peak_bytes - kept.peak_bytes == unkept + work[1] - work[0] > 0


@pytest.mark.parametrize("passes", [None, 1000])
def test_convs_chained_in_one_openvino_layer_save_a_call_and_the_tensor_between(
    model, monkeypatch, passes  # noqa: ANN001
) -> None:
    """Each conv whose output goes on to the next inside one OpenVINO layer saves a call,
    OPENVINO_CHAIN_PASSES over its output at the memory rate and, in a run of `passes`
    windows, its share of a compile; no other node changes (skipped without OpenVINO)."""
    if not openvino_ready():
        pytest.skip("needs OpenVINO")
    from znni.model.graph import reader_counts
    from znni.model.openvino_layers import absorbs_next_norm, openvino_chains
    from znni.planner.graph import openvino_costs

    ci = MachineProfile.load("ci-2core")
    machine = replace(ci, cpu_rates={**ci.cpu_rates, "openvino_flops_per_s": 1e15})
    graph = model.graph((32, 32, 32))
    chained = plan_graph(graph, machine, passes=passes)
    picked = {i: p.primitive for i, p in enumerate(chained.nodes)}
    chains = openvino_chains(graph, reader_counts(graph), picked.get)
    links = {i for chain in chains.values() for i in chain[:-1]}
    assert len(chains) >= 6 and len(links) >= 6  # BasicUNet's conv pairs
    picks = {i: (0.0, 0, 0, p.primitive) for i, p in enumerate(chained.nodes) if p.primitive}
    calls = openvino_costs.chain_calls(graph, picks)
    monkeypatch.setattr(openvino_costs, "openvino_chains", lambda *a: {})
    apart = plan_graph(graph, machine, passes=passes)
    first_s = 0.0 if passes is None else openvino_costs.OPENVINO_FIRST_CALL_S / passes
    for i, (a, b) in enumerate(zip(chained.nodes, apart.nodes, strict=True)):
        want = 0.0
        if i in links:
            out_bytes = conv_layer(graph, i, graph.nodes[i]).out_bytes
            want = (openvino_costs.OPENVINO_CHAIN_PASSES * out_bytes
                    / machine.rate("memory_bytes_per_s") + openvino_costs.OPENVINO_CALL_S + first_s)
        assert b.predicted_s - a.predicted_s == pytest.approx(want, abs=1e-12)
    assert chained.predicted_window_s < apart.predicted_window_s
    # memory: the tensors between are the layer's (kept), not ours (no buffer)
    readers = reader_counts(graph)
    kept = sum(int((openvino_costs.OPENVINO_KEPT_PER_CHAINED_NORMED_BYTE
                    if absorbs_next_norm(graph, i, readers, "openvino")
                    else openvino_costs.OPENVINO_KEPT_PER_CHAINED_BYTE)
                   * conv_layer(graph, i, graph.nodes[i]).out_bytes) for i in links)
    unbuilt = unbuilt_concats(graph, picks)
    ours = graph.peak_tensor_bytes(unbuilt=unbuilt) - graph.peak_tensor_bytes(unbuilt=unbuilt,
                                                                              calls=calls)
    assert ours >= 0  # where the peak falls on a chain (Graph.live_tensor_bytes' tests)
    assert apart.peak_bytes - chained.peak_bytes == ours - kept


def test_convs_that_would_chain_move_to_openvino_together_where_the_link_pays(model) -> None:
    """In a run of 27 windows a small conv alone is faster on another primitive than on
    OpenVINO with its share of a compile; a pair that would chain moves to OpenVINO
    together where both there, less the link's saving, beat their fastest options alone
    (skipped without OpenVINO)."""
    if not openvino_ready():
        pytest.skip("needs OpenVINO")
    from znni.model.graph import reader_counts
    from znni.model.openvino_layers import openvino_chains
    from znni.planner.graph import openvino_costs
    from znni.planner.graph import search as graph_search

    machine, graph = MachineProfile.load("ci-2core"), model.graph((32, 32, 32))
    options = graph_search._conv_options(graph, machine, graph.peak_tensor_bytes(), 2**33,
                                         passes=27, batch=1)
    picked = {i: n.primitive for i, n in enumerate(plan_graph(graph, machine, 2**33, passes=27).nodes)}
    ov = {i: next(o for o in opts if o[3] == "openvino") for i, opts in options.items()
          if any(o[3] == "openvino" for o in opts)}
    chains = openvino_chains(graph, reader_counts(graph), lambda j: "openvino" if j in ov else None)
    moved = 0
    for a, b in (c for c in chains.values() if len(c) == 2):
        both_s = ov[a][0] + ov[b][0] - openvino_costs.link_seconds(graph, a, machine, batch=1,
                                                                passes=27)
        alone_s = options[a][0][0] + options[b][0][0]
        assert (picked[a] == picked[b] == "openvino") == (both_s < alone_s)
        moved += picked[a] == "openvino" and "openvino" not in (options[a][0][3],
                                                                 options[b][0][3])
    assert moved >= 4
