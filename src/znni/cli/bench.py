"""`znni bench NAME [ARGS...]`: run benchmarks/NAME.py of the source checkout."""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

import znni


def benchmarks_dir() -> Path:
    """benchmarks/ lives beside src/ in the checkout (editable installs, `make bench`)."""
    return Path(znni.__file__).resolve().parents[2] / "benchmarks"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="run a benchmark from benchmarks/ (layers, networks, ...)")
    p.add_argument("name", help="benchmark name: the file benchmarks/NAME.py")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    folder = benchmarks_dir()
    script = folder / f"{args.name}.py"
    if not script.is_file():
        names = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))
        raise ValueError(
            f"no benchmark {args.name!r} in {folder}; available: {', '.join(names) or 'none'} "
            "(benchmarks run from a source checkout)"
        )
    sys.argv = [str(script), *args.args]
    runpy.run_path(str(script), run_name="__main__")
    return 0
