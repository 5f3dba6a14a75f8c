"""`import znni.cli` stays cheap: no numpy, zarr, pyFFTW, engine or planner until a command runs."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("numpy", "zarr", "pyfftw", "cupy", "fastapi", "znni.engine", "znni.planner", "znni.api")


def _loaded_after(code: str) -> list[str]:
    probe = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_cli_loads_nothing_heavy() -> None:
    loaded = _loaded_after("import znni.cli")
    heavy = [m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert heavy == []
    assert "znni.cli.segment" in loaded and "znni.cli.serve" in loaded  # registered statically


def test_building_the_parser_loads_only_the_job_vocabulary() -> None:
    loaded = _loaded_after("import znni.cli\nznni.cli.build_parser()")
    heavy = [m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    # the job, the store context, the locations and the scheduler it carries: plain values,
    # no numpy, zarr or stores
    assert heavy == ["znni.engine", "znni.engine.context", "znni.engine.job",
                     "znni.engine.location", "znni.engine.scheduler"]


def test_every_subcommand_is_registered() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "znni.cli", "--help"], capture_output=True, text=True, check=True
    )
    for name in ("segment", "plan", "serve", "bench", "demo"):
        assert name in out.stdout
