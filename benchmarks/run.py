"""Run every benchmark of the course and print one table: ``python -m benchmarks.run [--quick]``.

Each row measures two implementations of the same work in this one run and
gives their ratio; see ``benchmarks/README.md``. Benchmarks print figures;
tests never time anything.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import time

if __package__ in (None, ""):  # `python benchmarks/run.py`: make the package importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    __package__ = "benchmarks"

import torch  # noqa: E402

from benchmarks.common import Settings, format_table  # noqa: E402

# Modules with a BENCHMARKS dict {name: function(Settings) -> list[Row]}, in the order of the course.
MODULES = ["benchmarks.wordpiece", "benchmarks.gpt", "benchmarks.bert", "benchmarks.attention", "benchmarks.minimal_gpt",
           "benchmarks.t5", "benchmarks.families",
           "benchmarks.precision"]
# A module that places its models and data on Settings.device says so with DEVICES = ("cpu", "cuda", ...);
# on another device the others are skipped (they measure the CPU: tokenizers, tensor-memory accounting).


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats (about a minute)")
    parser.add_argument("--device", default="cpu",
                        help="cpu (default), cuda, cuda:N or mps: where models and data live; on a GPU the clocks "
                             "are read after synchronising, and --threads and --clock cpu do not apply")
    parser.add_argument("--compile", action="store_true",
                        help="also time torch.compile'd models where a benchmark offers it (gpt.training)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for every benchmark, both sides alike (default 1: small models on a "
                             "shared machine time far more stably, and OpenMP spin-waits do not swamp them)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall: elapsed time; cpu: CPU time of this process (robust on a busy shared machine)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per measurement (median reported)")
    parser.add_argument("--only", nargs="*", default=None, help="run only these benchmarks (names as listed by --list)")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)

    from companion.device import pick_device

    device = pick_device(args.device)  # refuses a device this machine lacks
    benchmarks, skipped = {}, []
    for module in MODULES:
        mod = importlib.import_module(module)
        for name, fn in mod.BENCHMARKS.items():
            full = f"{module.split('.')[-1]}.{name}"
            if device.type in getattr(mod, "DEVICES", ("cpu",)):
                benchmarks[full] = fn
            else:
                skipped.append(full)
    if args.list:
        print("\n".join(benchmarks))
        return 0
    repeats = args.repeats or (3 if args.quick else 5)
    settings = Settings(quick=args.quick, repeats=repeats, warmup=2 if args.compile else 1,
                        clock=args.clock if device.type == "cpu" else "wall", device=str(device), compile=args.compile)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
        where = f"{torch.get_num_threads()} threads, {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}"
    else:
        where = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    print(f"torch {torch.__version__}, {where}, {settings.clock} clock, median of {repeats} repeats"
          f"{', quick sizes' if args.quick else ''}{', with torch.compile' if args.compile else ''}", flush=True)
    if skipped:
        print(f"  not run on {device}: {', '.join(skipped)}", file=sys.stderr, flush=True)

    rows, start = [], time.perf_counter()
    for name, fn in benchmarks.items():
        if args.only and name not in args.only and name.split(".")[-1] not in args.only:
            continue
        t0 = time.perf_counter()
        rows += fn(settings)
        print(f"  {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    print(format_table(rows))
    print(f"total {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
