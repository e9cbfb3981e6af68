"""The command line: ``python -m benchmarks NAME [args]`` runs the module ``benchmarks.NAME``.

A benchmark module has a docstring whose first line is its summary, and three functions:
``add_arguments(parser)``, ``run(args) -> dict`` (the figures: ``rows`` and whatever its
table reads; ``device`` names the device measured) and ``table(result) -> str`` (markdown,
with the ratio columns). The command line adds ``--smoke`` and ``--out`` to every one,
writes the result with its metadata (:func:`benchmarks.results.write`) and prints the table.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import pathlib
import sys
import tempfile

from benchmarks import results

# The benchmarks, in the order BENCHMARKS.md shows them.
BENCHMARKS = ("splat", "train_step", "captured_step", "memory", "cameras", "hybrid", "mesh", "sensor",
              "arc_autodiff", "arc_micro", "multi_gpu", "host", "train", "mesh_coverage", "profile", "sanitize")
SMOKE_OUT = pathlib.Path(tempfile.gettempdir()) / "arc_warp_benchmarks_smoke"


def summary(name: str) -> str:
    """The first line of ``benchmarks/NAME.py``'s docstring, read without importing it."""
    path = pathlib.Path(__file__).with_name(f"{name}.py")
    return (ast.get_docstring(ast.parse(path.read_text())) or "").splitlines()[0]


def listing() -> str:
    width = max(map(len, BENCHMARKS + ("report",)))
    lines = [f"  {name:<{width}}  {summary(name)}" for name in BENCHMARKS + ("report",)]
    return "benchmarks:\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    top = argparse.ArgumentParser(
        prog="python -m benchmarks", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="arc_warp's benchmarks. `python -m benchmarks NAME --help` describes one; `--smoke` runs it at "
                    "tiny sizes on the CPU.", epilog=listing())
    top.add_argument("name", metavar="NAME", choices=BENCHMARKS + ("report",), help="the benchmark to run")
    if not argv or argv[0].startswith("-"):
        top.parse_args(argv)  # prints the help, or the error
        top.error("a benchmark NAME is needed")
    name = argv[0]
    if name not in BENCHMARKS + ("report",):
        top.parse_args(argv[:1])  # argparse's error names the choices
    module = importlib.import_module(f"benchmarks.{name}")
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks {name}", description=module.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    if name == "report":
        module.add_arguments(parser)
        return module.run(parser.parse_args(argv[1:]))
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes on the CPU: checks the code, times nothing (written under --out, by default "
                             f"{SMOKE_OUT})")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help=f"folder of the result JSON (default {results.RESULTS}; with --smoke {SMOKE_OUT})")
    parser.add_argument("--label", default=None,
                        help=f"write {name}-LABEL.json instead of {name}.json (a second run kept beside the first, "
                             "e.g. another peer version)")
    module.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    import warp as wp

    wp.config.log_level = wp.LOG_WARNING  # no line per module load
    wp.init()
    args.out = args.out or (SMOKE_OUT if args.smoke else results.RESULTS)
    result = module.run(args)
    path = results.write(name if args.label is None else f"{name}-{args.label}", result, args.out, argv,
                         smoke=args.smoke)
    print()
    print(module.table(result))
    print(f"\nwrote {path}")
    return 0
