"""A worker process of the Python SDK for the integration tests (tests/integration/
test_sdk_workers.py): ``python tests/integration/sdk_worker_app.py URL KEY QUEUE MODE [POLL_WAIT]``
(POLL_WAIT: the seconds a poll may wait for work, 5 by default).

Its handlers: ``resize`` (returns its input's width and the keys of its upstream
outputs), ``upload`` (returns how many upstream outputs it got), ``echo`` (returns its
input), ``leak`` and ``leak_fail`` (send their input's secret back in a log line and
the output, or in a failure's error), and ``hang``: with MODE ``hang`` it sleeps until the process is killed, with
MODE ``quick`` it returns at once. It serves until SIGTERM (the SDK drains) or SIGKILL.
"""

from __future__ import annotations

import sys
import time

from flowforge_sdk import NonRetryableError, Worker


def main(base: str, key: str, queue: str, mode: str, poll_wait: str = "5") -> None:
    worker = Worker(base, queue, api_key=key, concurrency=4, worker_name=f"it-{mode}",
                    poll_wait_seconds=float(poll_wait))

    @worker.task("resize")
    def resize(ctx):
        return {"width": ctx.input["width"], "upstream": sorted(ctx.upstream)}

    @worker.task("upload")
    def upload(ctx):
        ctx.log(f"uploading {len(ctx.upstream)} results")
        return {"uploaded": len(ctx.upstream)}

    @worker.task("echo")
    def echo(ctx):
        return ctx.input

    @worker.task("leak")
    def leak(ctx):
        # Everything a careless handler could send back: the resolved secret in its log line,
        # its output; the server redacts both.
        ctx.log(f"calling with token {ctx.input['token']}")
        return {"echo": ctx.input, "note": f"used {ctx.input['token']}"}

    @worker.task("leak_fail")
    def leak_fail(ctx):
        raise NonRetryableError(f"the API refused token {ctx.input['token']}")

    @worker.task("hang")
    def hang(ctx):
        if mode == "hang":
            print("hanging", flush=True)
            time.sleep(3600)
        return {"mode": mode}

    worker.run()


if __name__ == "__main__":
    main(*sys.argv[1:6])
