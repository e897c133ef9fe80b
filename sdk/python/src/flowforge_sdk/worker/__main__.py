"""``python -m flowforge_sdk.worker module:attribute`` (or ``flowforge-worker …``): import
the Worker ``attribute`` of ``module`` (or a function returning one) and run it until
SIGTERM or Ctrl-C. Exits 0 after a drain, 1 when the worker stopped on an error (a
refused key, a refused queue), 2 for a bad argument."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from flowforge_sdk.errors import FlowForgeError
from flowforge_sdk.worker.runtime import Worker


def load_worker(target: str) -> Worker:
    """The Worker named by ``module:attribute`` (the attribute may be a function returning one)."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"expected module:attribute (e.g. examples.worker:worker), got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does for the script's folder
    module = importlib.import_module(module_name)
    value = getattr(module, attribute)
    if not isinstance(value, Worker) and callable(value):
        value = value()
    if not isinstance(value, Worker):
        raise TypeError(f"{target} is a {type(value).__name__}, not a flowforge_sdk.Worker")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flowforge_sdk.worker",
                                     description="Run a FlowForge worker defined in your code.")
    parser.add_argument("target", help="module:attribute of a flowforge_sdk.Worker, e.g. workers:worker")
    parser.add_argument("--log-level", default=os.environ.get("FLOWFORGE_LOG_LEVEL", "INFO"),
                        help="logging level (default INFO, or FLOWFORGE_LOG_LEVEL)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per poll and heartbeat otherwise
    try:
        worker = load_worker(args.target)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        print(f"error: cannot load the worker {args.target!r}: {exc}", file=sys.stderr)
        return 2
    try:
        worker.run()
    except FlowForgeError as exc:
        print(f"error: the worker stopped: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
