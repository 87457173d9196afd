"""Run kraft benchmarks: ``python -m bench [--quick] [name …]`` (no names: all of them, in order).

Each name is a module ``bench/<name>.py`` whose ``main()`` runs it, or a variant of one
(:data:`VARIANTS`: ``raft-tls``, ``controller-tls`` run ``--tls``, PLAINTEXT against mutual TLS);
``--quick`` is passed through to every benchmark (smaller sizes).  Results land in
``bench/results/<name>.json``.  Exit status 1 if any benchmark failed (the others still run), 2 for an
unknown name.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from pathlib import Path

from kraft.procutil import reap_children_on_exit

# Known benchmarks, run in this order when no name is given.  Add yours here.
BENCHMARKS: tuple[str, ...] = (
    "storage",
    "raft",
    "controller",
    "broker",
    "partition_stop",
    "pipeline",
    "open_files",
    "hwm_checkpoint",
    "raft-tls",
    "controller-tls",
)

VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "raft-tls": ("raft", ("--tls",)),
    "controller-tls": ("controller", ("--tls",)),
}
"""A benchmark name → (its module, the options it runs with); each writes ``bench/results/<name>.json``."""

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def run_one(name: str, quick: bool) -> bool:
    module_name, options = VARIANTS.get(name, (name, ()))
    module = importlib.import_module(f"bench.{module_name}")
    saved_argv = sys.argv
    sys.argv = [f"python -m bench.{module_name}", *options, *(["--quick"] if quick else [])]
    started = time.monotonic()
    try:
        outcome = module.main()
    except SystemExit as exc:  # argparse / sys.exit inside main()
        outcome = exc.code
    finally:
        sys.argv = saved_argv
    if isinstance(outcome, dict):
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        (RESULTS_DIR / f"{name}.json").write_text(json.dumps(outcome, indent=2) + "\n")
        outcome = 0
    ok = outcome in (None, 0)
    print(f"bench: {name} {'ok' if ok else f'FAILED ({outcome})'} in {time.monotonic() - started:.1f} s")
    return ok


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument(
        "names", nargs="*", help=f"benchmarks to run (default: all of {', '.join(BENCHMARKS)})"
    )
    parser.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        print(
            f"error: unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}",
            file=sys.stderr,
        )
        return 2
    failed = []
    for name in args.names or BENCHMARKS:
        try:
            if not run_one(name, args.quick):
                failed.append(name)
        except Exception:  # one broken benchmark must not stop the others
            traceback.print_exc()
            print(f"bench: {name} FAILED (exception)")
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
