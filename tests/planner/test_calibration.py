"""Calibration: fitted rates and size scaling, the profile's scaling lookup, and the cache."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import numpy as np
import pytest

from znni.model.network import LayerShape
from znni.planner import calibrate
from znni.planner.costs import Work, cpu_seconds, working_set_bytes
from znni.planner.costs import layer_seconds as modelled  # a cost model: nothing is timed
from znni.planner.machine import DEFAULT_CPU_RATES, MachineProfile


def _profile(**kw) -> MachineProfile:  # type: ignore[no-untyped-def]
    return MachineProfile(name="t", cores=2, memory_bytes=2**34, **kw)


def test_scaling_is_linear_in_log_bytes_and_clamped() -> None:
    prof = _profile(cpu_scaling={"direct": ((1e3, 1.0), (1e9, 4.0))})
    assert prof.scaling("direct", 1e3) == pytest.approx(1.0)
    assert prof.scaling("direct", 1e9) == pytest.approx(4.0)
    assert prof.scaling("direct", 1e6) == pytest.approx(2.5)  # halfway in log10: 3 .. 9
    assert prof.scaling("direct", 10.0) == pytest.approx(1.0)  # below: the small end
    assert prof.scaling("direct", 1e12) == pytest.approx(4.0)  # beyond: the big end
    assert prof.scaling("fft-keep", 1e6) == 1.0  # not calibrated: the model as is


def test_layer_seconds_applies_the_primitive_scaling() -> None:
    sh = LayerShape(0, "conv", 1, 8, (20, 20, 20), 1, 8, (18, 18, 18), (3, 3, 3))
    plain = _profile()
    scaled = _profile(cpu_scaling={"direct": ((1.0, 3.0), (2.0, 3.0))})
    t = modelled(sh, "direct", plain)
    assert modelled(sh, "direct", scaled) == pytest.approx(3 * t)
    assert modelled(sh, "fft-keep", scaled) == pytest.approx(
        modelled(sh, "fft-keep", plain))
    assert working_set_bytes(sh) == 4 * 8 * (20**3 + 18**3)


def test_direct_counts_its_column_gather() -> None:
    sh = LayerShape(0, "conv", 2, 5, (9, 9, 9), 2, 3, (7, 7, 7), (3, 3, 3))
    plain = _profile()
    t = modelled(sh, "direct", plain)
    # blocks of 4 and 3 output planes per sample (>= 2 blocks per worker of 2); a block of
    # zb planes spans (zb - 1) input planes of 9x9, 6 rows of 9 and one row of 7 positions
    computed = 2 * ((3 * 81 + 6 * 9 + 7) + (2 * 81 + 6 * 9 + 7))
    gather_bytes = 2 * 4 * (5 * 27 * computed)  # write and read f*k^3 floats per position
    slow = _profile(cpu_rates={**DEFAULT_CPU_RATES, "gather_bytes_per_s": 1e9})
    expect = t + gather_bytes / 1e9 - gather_bytes / DEFAULT_CPU_RATES["gather_bytes_per_s"]
    assert modelled(sh, "direct", slow) == pytest.approx(expect)
    pointwise = LayerShape(0, "conv", 2, 5, (9, 9, 9), 2, 3, (9, 9, 9), (1, 1, 1))
    assert modelled(pointwise, "direct", slow) == pytest.approx(
        modelled(pointwise, "direct", plain))  # 1x1x1 reads the input in place


def test_profile_round_trips_scaling_and_refuses_malformed() -> None:
    prof = _profile(cpu_scaling={"maxpool": ((1e6, 0.8), (1e8, 2.0))})
    back = MachineProfile.from_dict(json.loads(json.dumps(prof.to_dict())))
    assert back.scaling("maxpool", 1e7) == pytest.approx(prof.scaling("maxpool", 1e7))
    for bad in ([[1e6, -1.0]], "x", [[1, 2, 3]], []):
        with pytest.raises(ValueError, match="cpu_scaling"):
            MachineProfile.from_dict({**prof.to_dict(), "cpu_scaling": {"direct": bad}})


def test_fit_recovers_rates_and_a_log_linear_scaling() -> None:
    """Synthetic rows made from known rates and a known factor a + b*ln(ws) (within the
    scaling's bounds): the fit finds both."""
    truth = {**DEFAULT_CPU_RATES, "fft_flops_per_s": 7e9, "direct_flops_per_s": 90e9}
    rows = []
    for i, ws in enumerate((1e5, 1e6, 1e7, 1e8)):
        for key, work in (
            ("direct", Work(direct_flops=1e9 * (i + 1), gather_bytes=1e8, memory_bytes=1e7)),
            ("fft-keep", Work(fft_flops=2e9 * (i + 1), madd_flops=1e9, madd_bytes=1e8,
                              memory_bytes=1e7 * (4 - i), pack_bytes=3e8 * (i % 2 + 1))),
        ):
            factor = 1.0 if key == "direct" else 0.3 + 0.05 * math.log(ws)
            t = cpu_seconds(work, _profile(cpu_rates=truth)) * factor
            rows.append((key, work, t, int(ws)))
    rates = calibrate.fit_rates([(w, t) for _, w, t, _ in rows], dict(DEFAULT_CPU_RATES))
    scaling = calibrate.fit_scaling(rows, rates)
    fitted = _profile(cpu_rates=rates, cpu_scaling={k: tuple(map(tuple, v))
                                                    for k, v in scaling.items()})
    for key, work, t, ws in rows:
        pred = cpu_seconds(work, fitted) * fitted.scaling(key, ws)
        assert pred == pytest.approx(t, rel=0.15), (key, ws, pred, t)
    lo, hi = scaling["fft-keep"][0][1], scaling["fft-keep"][-1][1]
    assert hi / lo == pytest.approx((0.3 + 0.05 * math.log(1e8)) / (0.3 + 0.05 * math.log(1e5)),
                                    rel=0.1)


def test_scaling_fit_ignores_an_outlying_row_and_stays_bounded() -> None:
    """One row 3x its model (a GEMM the model misses, a noisy neighbour) does not tilt the
    fitted factor (a least-squares line through the ratios did: 1.56 at the top end where
    the steady runs were 1.0); a primitive the model misses by 10x is held at the bounds."""
    rates = dict(DEFAULT_CPU_RATES)
    prof = _profile(cpu_rates=rates)
    sizes = (1e6, 3e6, 1e7, 3e7, 1e8, 4e8)
    rows = []
    for i, ws in enumerate(sizes):
        work = Work(direct_flops=1e9 * (i + 1))
        factor = 3.0 if i == 3 else 1.0
        rows.append(("direct", work, cpu_seconds(work, prof) * factor, int(ws)))
        rows.append(("fft-keep", work, cpu_seconds(work, prof) * 10.0, int(ws)))
    scaling = calibrate.fit_scaling(rows, rates)
    assert [f for _, f in scaling["direct"]] == pytest.approx([1.0, 1.0])
    assert [f for _, f in scaling["fft-keep"]] == pytest.approx(
        [calibrate.SCALING_BOUNDS[1]] * 2)


def test_direct_pays_whole_gemm_row_tiles() -> None:
    """The direct conv's GEMMs pay Cout rounded up to GEMM_ROW_TILE (an output layer of 3
    channels costs as 8), whole tiles as they are."""
    from znni.planner.costs import GEMM_ROW_TILE, cpu_conv_work

    def flops(g: int) -> float:
        return cpu_conv_work(LayerShape(0, "conv", 1, 8, (12, 12, 12), 1, g, (10, 10, 10),
                                        (3, 3, 3)), "direct").direct_flops

    assert GEMM_ROW_TILE == 8
    assert flops(3) == pytest.approx(flops(8)) and flops(16) == pytest.approx(2 * flops(8))
    assert flops(9) == pytest.approx(flops(16))


def test_quick_calibration_on_this_machine_and_the_cache(tmp_path, monkeypatch) -> None:
    """A real (quick) calibration gives positive rates and a scaling for every primitive;
    a cached calibration is read back without measuring, an outdated one is not used."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    base = _profile()
    quick = calibrate.calibrated_profile(base, quick=True)
    assert quick.calibrated
    assert all(np.isfinite(v) and v > 0 for v in quick.cpu_rates.values())
    assert set(quick.cpu_scaling) == {"direct", "fft-keep", "fft-recompute", "maxpool"}
    assert not calibrate.cache_path(2).exists()  # quick runs are never cached

    path = calibrate.cache_path(2)
    path.parent.mkdir(parents=True)
    stored = {"version": calibrate.CACHE_VERSION, "cpu_rates": quick.cpu_rates,
              "cpu_scaling": {k: [list(p) for p in v] for k, v in quick.cpu_scaling.items()},
              "base_rss_bytes": 12345}
    path.write_text(json.dumps(stored))
    cached = calibrate.calibrated_profile(base, measure=False)
    assert cached.calibrated and cached.base_rss_bytes == 12345
    assert cached.cpu_scaling == quick.cpu_scaling
    # a rate no calibration measures is the model's as it is now, not as it was cached
    stale = {**quick.cpu_rates, "fresh_page_bytes_per_s": 123.0}
    path.write_text(json.dumps({**stored, "cpu_rates": stale}))
    cached = calibrate.calibrated_profile(base, measure=False)
    assert cached.cpu_rates["fresh_page_bytes_per_s"] == \
        DEFAULT_CPU_RATES["fresh_page_bytes_per_s"]
    assert cached.cpu_rates["direct_flops_per_s"] == quick.cpu_rates["direct_flops_per_s"]
    path.write_text(json.dumps({**stored, "version": calibrate.CACHE_VERSION - 1}))
    assert calibrate.calibrated_profile(base, measure=False) == replace(base)


def test_cache_file_follows_a_blas_override(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    plain = calibrate.cache_path(2)
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    forced = calibrate.cache_path(2)
    assert plain != forced and forced.name.endswith("-blas-haswell.json")
    assert plain.parent == forced.parent == tmp_path / "znni"


def test_fft_products_follow_the_sample_and_channel_chunks() -> None:
    """fft_conv3d runs one small GEMM per frequency, per sample chunk and, when recomputing,
    per output-channel chunk of RECOMPUTE_BYTES: counted from its chunk arithmetic."""
    from znni.planner import costs

    small = LayerShape(0, "conv", 2, 4, (10, 10, 10), 2, 6, (8, 8, 8), (3, 3, 3))
    nc = 10 * 10 * 6  # rfft of 10^3
    assert costs.cpu_conv_work(small, "fft-keep").products == nc
    assert costs.cpu_products(small, "fft-recompute") == nc  # (untiled) one chunk of each
    big = LayerShape(0, "conv", 8, 80, (85, 85, 85), 8, 80, (77, 77, 77), (9, 9, 9))
    spectrum_bytes = 80 * 88 * 88 * 45 * 8  # one output channel's Cin spectra at 88^3
    per_sample = 160 * 88 * 88 * 45 * 8
    oc = max(1, costs.RECOMPUTE_BYTES // spectrum_bytes)
    samples = max(1, costs.WORK_BYTES // per_sample)
    expect = -(-8 // samples) * -(-80 // oc) * 88 * 88 * 45
    untiled = costs.conv_work(big, "fft-recompute")
    assert untiled.products == 0  # the generic (GPU) count has no per-product cost
    assert costs.cpu_products(big, "fft-recompute") == expect
    # every output-channel chunk gathers all input spectra of the batch again
    assert costs.cpu_pack_bytes(small, "fft-keep") == 2 * 4 * nc * 8
    assert costs.cpu_pack_bytes(big, "fft-recompute") == -(-80 // oc) * 8 * 80 * 88 * 88 * 45 * 8


class _Terminal(__import__("io").StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_on_a_terminal_and_silence_elsewhere() -> None:
    """On a terminal: one line, rewritten in place, with the step count, what is measured
    and the seconds left; cleared at the end. Elsewhere (or quiet): nothing."""
    from znni.planner.calibration_steps import Step, run_steps

    steps = [Step(f"s{i}", f"thing {i}", 2.0, lambda i=i: float(i)) for i in range(3)]
    tty = _Terminal()
    saved: list[dict] = []
    out = run_steps(steps, {"s0": 0.5}, lambda m: saved.append(dict(m)), stream=tty)
    assert out == {"s0": 0.5, "s1": 1.0, "s2": 2.0}  # s0 was measured before: kept
    assert [sorted(m) for m in saved] == [["s0", "s1"], ["s0", "s1", "s2"]]
    text = tty.getvalue()
    assert "\n" not in text and text.endswith("\r")
    shown = [part.strip() for part in text.split("\r") if part.strip()]
    assert len(shown) == 2
    assert re.fullmatch(r"calibrating \[#{6}-{14}\] 1/3 thing 1, ~\d+ s left", shown[0])
    assert re.fullmatch(r"calibrating \[#{13}-{7}\] 2/3 thing 2, ~\d+ s left", shown[1])
    for stream, quiet in ((__import__("io").StringIO(), False), (_Terminal(), True)):
        run_steps(steps, {}, lambda m: None, stream=stream, quiet=quiet)
        assert stream.getvalue() == ""


def _fake_parts(monkeypatch, tmp_path, ran: list[str], fail_at: str | None = None) -> None:
    """The calibration at the quick shapes with made-up seconds, recording what it ran."""
    from znni.planner.calibration_steps import Step

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for name, value in (("FULL_SHAPES", calibrate.QUICK_SHAPES),
                        ("FULL_POOLS", calibrate.QUICK_POOLS), ("FFT_SHAPES", ())):
        monkeypatch.setattr(calibrate, name, value)
    monkeypatch.setattr(calibrate, "baseline_rss_bytes", lambda: 1)

    def run(key: str, value: object) -> object:
        if key == fail_at:
            raise KeyboardInterrupt
        ran.append(key)
        return value

    def part_steps(part, profile, state, backends):  # type: ignore[no-untyped-def]
        if part != "cpu":
            return [Step(part, part, 1.0, lambda: run(part, {}))]
        real = calibrate.cpu_steps(backends, profile, calibrate.QUICK_SHAPES,
                                   calibrate.QUICK_POOLS)
        return [Step(s.key, s.label, s.estimate_s, lambda k=s.key, i=i: run(k, 0.01 * (i + 1)))
                for i, s in enumerate(real)]

    monkeypatch.setattr(calibrate, "part_steps", part_steps)


def test_a_calibration_measures_only_the_parts_asked_and_resumes(tmp_path, monkeypatch) -> None:
    """A sequential plan's calibration measures the CPU primitives only; a graph model's adds
    the graph primitives alone; OpenVINO's conv only where it is installed. Every step is
    cached as it is done: an interrupted calibration measures only the steps it lacks."""
    from znni.planner.graph import openvino_costs

    monkeypatch.setattr(openvino_costs, "openvino_ready", lambda: False)
    ran: list[str] = []
    _fake_parts(monkeypatch, tmp_path, ran, fail_at="fft-keep 8,8,8,3,10")
    base = _profile()
    with pytest.raises(KeyboardInterrupt):
        calibrate.calibrated_profile(base)
    before = list(ran)
    assert before and "graph" not in before
    cached = json.loads(calibrate.cache_path(2).read_text())
    assert sorted(cached["steps"]) == sorted(before) and cached["parts"] == []
    assert not calibrate.calibrated_profile(base, measure=False).calibrated

    ran.clear()
    _fake_parts(monkeypatch, tmp_path, ran)
    done = calibrate.calibrated_profile(base)
    assert done.calibrated and ran and not set(ran) & set(before)  # the rest, once each
    assert "graph" not in ran and json.loads(calibrate.cache_path(2).read_text())["parts"] == [
        "cpu"]
    ran.clear()
    calibrate.measured_parts(base, ("graph", "openvino"))
    assert ran == ["graph"]  # OpenVINO is not installed (here): not measured
    ran.clear()
    assert calibrate.calibrated_profile(base, parts=("graph",)).calibrated and ran == []


def test_a_first_plan_measures_its_part_and_the_rest_comes_once(tmp_path,
                                                              monkeypatch) -> None:
    """first_plan measures FIRST_PLAN_SHAPES' and FIRST_PLAN_POOLS' steps only, fits a partial
    profile from them and keeps them as the whole calibration's steps: a second first plan
    measures nothing, the whole calibration then only the rest, and after it a first plan
    gets the whole calibration's profile."""
    from znni.planner.graph import openvino_costs

    monkeypatch.setattr(openvino_costs, "openvino_ready", lambda: False)
    ran: list[str] = []
    _fake_parts(monkeypatch, tmp_path, ran)
    first_shapes, first_pools = calibrate.QUICK_SHAPES[:2], calibrate.QUICK_POOLS[:1]
    monkeypatch.setattr(calibrate, "FIRST_PLAN_SHAPES", first_shapes)
    monkeypatch.setattr(calibrate, "FIRST_PLAN_POOLS", first_pools)
    wanted = {",".join(map(str, s)) for s in (*first_shapes, *first_pools)}
    base = _profile()

    first = calibrate.calibrated_profile(base, first_plan=True)
    assert first.calibrated and first.partial_calibration
    assert first.cpu_rates != base.cpu_rates
    assert ran and {k.rsplit(" ", 1)[-1] for k in ran} == wanted
    assert any(k.startswith("maxpool") for k in ran)
    cached = json.loads(calibrate.cache_path(2).read_text())
    assert cached["parts"] == [] and sorted(cached["steps"]) == sorted(ran)
    first_ran = list(ran)

    ran.clear()
    assert calibrate.calibrated_profile(base, first_plan=True).partial_calibration
    assert ran == []  # cached: nothing measured again
    cached_first = calibrate.calibrated_profile(base, measure=False)  # segment, the server
    assert cached_first == first and ran == []

    whole = calibrate.calibrated_profile(base)
    assert whole.calibrated and not whole.partial_calibration
    assert ran and not set(ran) & set(first_ran)  # only the rest
    ran.clear()
    assert calibrate.calibrated_profile(base, first_plan=True) == whole and ran == []


def test_a_graph_plan_measures_its_primitives_only_after_the_whole_calibration(
        tmp_path, monkeypatch) -> None:
    """A graph model's plan measures its graph primitives on a calibrated machine; a first
    plan's partial calibration does not count (they are fitted on the whole one's rates),
    and it does not start the rest of the CPU's calibration either."""
    from znni.planner import detect
    from znni.planner.graph import openvino_costs

    monkeypatch.setattr(openvino_costs, "openvino_ready", lambda: False)
    ran: list[str] = []
    _fake_parts(monkeypatch, tmp_path, ran)
    monkeypatch.setattr(calibrate, "FIRST_PLAN_SHAPES", calibrate.QUICK_SHAPES[:1])
    monkeypatch.setattr(calibrate, "FIRST_PLAN_POOLS", calibrate.QUICK_POOLS)
    assert detect.detect_machine(first_plan=True).partial_calibration
    ran.clear()
    detect.calibrate_graph_primitives()
    assert ran == []
    assert not detect.detect_machine().partial_calibration  # the whole calibration
    ran.clear()
    detect.calibrate_graph_primitives()
    assert ran == ["graph"]


def test_znni_plan_says_when_its_rates_are_a_first_plans(tmp_path, monkeypatch,
                                                         capsys) -> None:
    """`znni plan NETWORK` on an uncalibrated machine measures only a first plan's part and
    says so (text and --json); once the whole calibration is cached it says nothing."""
    from pathlib import Path

    from znni.cli import main
    from znni.cli.plan import PARTIAL_NOTE
    from znni.planner.graph import openvino_costs

    monkeypatch.setattr(openvino_costs, "openvino_ready", lambda: False)
    ran: list[str] = []
    _fake_parts(monkeypatch, tmp_path, ran)
    monkeypatch.setattr(calibrate, "FIRST_PLAN_SHAPES", calibrate.QUICK_SHAPES[:1])
    monkeypatch.setattr(calibrate, "FIRST_PLAN_POOLS", calibrate.QUICK_POOLS)
    net = Path(__file__).resolve().parents[2] / "benchmarks" / "networks" / "n337.json"
    assert main(["plan", str(net)]) == 0
    assert PARTIAL_NOTE in capsys.readouterr().out
    assert ran and all(k.rsplit(" ", 1)[-1] in {"1,1,8,3,20", "1,4,31", "8,4,15"}
                       for k in ran)
    assert main(["plan", str(net), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["partial_calibration"] == PARTIAL_NOTE
    import zarr

    zarr.create_array(store=str(tmp_path / "in.zarr"), shape=(90, 90, 90),
                      chunks=(45, 45, 45), dtype="uint8")
    ran.clear()
    assert main(["plan", str(net), "--input", str(tmp_path / "in.zarr")]) == 0  # a run's
    assert "first plan on this machine" not in capsys.readouterr().out
    assert any(k.rsplit(" ", 1)[-1] == "8,8,8,3,10" for k in ran)  # the rest, measured now
    assert json.loads(calibrate.cache_path(2).read_text())["parts"] == ["cpu"]
    assert main(["plan", str(net)]) == 0
    assert "first plan on this machine" not in capsys.readouterr().out


def test_a_plan_for_another_machine_never_calibrates(tmp_path, monkeypatch, capsys) -> None:
    """`znni plan --machine PROFILE` reads no calibration and writes none."""
    from pathlib import Path

    from znni.cli import main
    from znni.planner import calibration_steps

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    def refuse(*args, **kw):  # type: ignore[no-untyped-def]
        raise AssertionError("calibrated")

    monkeypatch.setattr(calibration_steps, "run_steps", refuse)
    monkeypatch.setattr(calibrate, "run_steps", refuse)
    net = Path(__file__).resolve().parents[2] / "benchmarks" / "networks" / "n337.json"
    assert main(["plan", str(net), "--machine", "ci-2core", "--json"]) == 0
    assert '"machine": "ci-2core"' in capsys.readouterr().out
    assert not list(tmp_path.rglob("machine-*.json"))


ZEN4 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse avx avx2 fma avx512f avx512bw avx512_bf16 avx512_vnni\n"
AVX2_ONLY = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse avx avx2 fma\n"


def test_a_cpu_with_other_instruction_sets_gets_its_own_calibration(tmp_path,
                                                                    monkeypatch) -> None:
    """The same host name on another CPU (a VM moved from an AVX-512 Zen 4 to an AVX2-only
    one): another signature, so the other's cached rates are not used."""
    assert calibrate.cpu_signature(ZEN4) != calibrate.cpu_signature(AVX2_ONLY)
    reordered = AVX2_ONLY.replace("avx avx2 fma", "fma avx2 avx sse4_2")  # order, other flags
    assert calibrate.cpu_signature(reordered) == calibrate.cpu_signature(AVX2_ONLY)
    assert calibrate.cpu_signature(AVX2_ONLY.replace("AMD EPYC", "Intel Xeon")) != \
        calibrate.cpu_signature(AVX2_ONLY)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    assert f"-cpu{calibrate.cpu_signature()}" in calibrate.cache_path(2).name


def test_fftw_planning_is_measured_per_point_and_left_in_the_wisdom(tmp_path,
                                                                    monkeypatch) -> None:
    """The planning step plans a conv's workspaces from no wisdom, counts the image
    transforms' points as jobtime.cold_fft does, and leaves the plans in the wisdom for
    the conv step, with what the wisdom held before; the rate is seconds over points of
    all planning steps."""
    pytest.importorskip("pyfftw")
    from znni.planner.cpu_measure import fftw_s_per_point, planning_step
    from znni.primitives.cpu.backend import usable_cores
    from znni.primitives.cpu.fft_workspaces import FftSettings, layer_workspaces
    from znni.primitives.cpu.fftw_plans import in_wisdom

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    shape = (2, 3, 4, 3, 13)  # (S, Cin, Cout, k, n): odd sizes, several channels
    spaces = layer_workspaces(False, (2, 3, 13, 13, 13), (4, 3, 3, 3, 3),
                              FftSettings(spectra_budget=calibrate.SPECTRA_BYTES))
    backends = calibrate.Backends(quick=False)
    seconds, points = planning_step(backends, shape, "fft-recompute", 1.0).run()
    assert isinstance(seconds, float)  # its value is the CPU's: benchmarks judge it
    assert points == sum(ws.points for ws in spaces if ws.images) > 0
    assert all(in_wisdom(ws.build, usable_cores(), "FFTW_MEASURE") for ws in spaces)
    # what an earlier step planned is not planned (nor counted) again, as cold_fft counts
    assert planning_step(backends, shape, "fft-recompute", 1.0).run()[1] == 0
    keep = layer_workspaces(True, (2, 3, 13, 13, 13), (4, 3, 3, 3, 3),
                            FftSettings(spectra_budget=calibrate.SPECTRA_BYTES))
    new = [ws for ws in keep if ws.key not in {w.key for w in spaces}]
    assert planning_step(backends, shape, "fft-keep", 1.0).run()[1] == sum(
        ws.points for ws in new if ws.images)
    assert all(in_wisdom(ws.build, usable_cores(), "FFTW_MEASURE") for ws in keep)
    backends.close()
    measured = {"fftw-plan fft-keep 1,2,3,3,9": [2.0, 1e7], "fft-keep 1,2,3,3,9": 0.5,
                "fftw-plan fft-recompute 1,2,3,3,9": [1.0, 2e7]}
    assert fftw_s_per_point(measured) == pytest.approx(3.0 / 3e7)
    assert fftw_s_per_point({"fft-keep 1,2,3,3,9": 0.5}) is None
    # a calibrated profile holding the rate reads back (the cache is not thrown away)
    profile = MachineProfile.from_dict({**_profile().to_dict(), "cpu_rates": {
        **DEFAULT_CPU_RATES, "fftw_measure_s_per_point": 1.5e-7}})
    assert profile.rate("fftw_measure_s_per_point") == 1.5e-7
