"""``python -m flowforge.devstack run|demo``: the main job on one machine.

Starts the web server (gunicorn), one Dramatiq worker command with two worker
processes, and the clock; starts a run of the example workflow; shows its
progress and a summary. ``run`` keeps serving until Ctrl-C, which stops every
process it started. ``demo`` stops everything once the run ends and exits 0 only
if the run succeeded. Set-up (virtualenv, migrations, demo data) is the Makefile's.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import django


def wait_for_web(web, bind: str, *, timeout: float = 30.0) -> str | None:
    """Wait until the web server started as ``web`` (a ``flowforge.stack.Proc``) answers
    ``GET http://<bind>/healthz`` with 200 and ``{"status": "ok"}``. Returns None then, or
    what went wrong: the process exited (gunicorn gives up when it cannot bind the
    address, after retrying for about 5 s), or no such answer within ``timeout`` seconds
    (another server holds the address, say)."""
    import json
    import urllib.error
    import urllib.request

    url = f"http://{bind}/healthz"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not web.alive():
            return f"the web server exited at start (is {bind} already in use?); see {web.log_path}"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200 and json.loads(response.read() or b"{}").get("status") == "ok":
                    return None
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    return f"nothing answered {url} like FlowForge within {timeout:.0f} s (is {bind} in use?); see {web.log_path}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run FlowForge's web, workers and clock with the example run.")
    parser.add_argument("mode", choices=["run", "demo"])
    parser.add_argument("--workflow", default="penguins-report", help="example workflow to start")
    parser.add_argument("--bind", default=os.environ.get("WEB_BIND", "127.0.0.1:8000"))
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the run")
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "flowforge.settings")
    django.setup()
    from django.conf import settings

    from engine.management.commands.show_run import print_summary
    from engine.reporting import load_summary
    from engine.services import resolve_workflow, start_run
    from flowforge.stack import Stack
    from tenancy.models import Organization

    log_dir = Path(settings.BASE_DIR) / "var" / "log"
    stack = Stack(env=dict(os.environ), log_dir=log_dir)
    interrupted = False

    def on_signal(signum, frame):
        nonlocal interrupted
        interrupted = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        web = stack.start_web(bind=args.bind)
        stack.start_worker(processes=2, threads=8)
        stack.start_clock()
        print(f"web      http://{args.bind}/   sign in as demo@flowforge.local / flowforge-demo   (log {log_dir}/web.log)")
        print(f"workers  dramatiq flowforge.worker --processes 2 --threads 8   (log {log_dir}/worker.log)")
        print(f"clock    manage.py run_clock   (log {log_dir}/clock.log)")
        problem = wait_for_web(web, args.bind)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 1
        for proc in stack.procs:
            if not proc.alive():
                print(f"error: {proc.name} exited at start; see {proc.log_path}", file=sys.stderr)
                return 1
        org = Organization.objects.get(slug="demo")
        wf = resolve_workflow(organization=org, workflow=args.workflow)
        run = start_run(workflow=wf, run_input={})
        print(f"started run {run.pk} of {wf.name} v{wf.version} ({wf.tasks.count()} tasks)")
        from engine.management.commands.start_run import wait_for_run

        class _Out:
            _out = sys.stdout

        state = wait_for_run(run, timeout=args.timeout, stdout=_Out())
        summary = load_summary(run.pk, run.organization_id)
        print_summary(_Out(), summary, events=False)
        retried = [(tr.task.key, tr.attempt) for tr in summary.task_runs if tr.attempt > 1]
        ok = state == "succeeded" and all(tr.state == "succeeded" for tr in summary.task_runs)
        duration = summary.duration_seconds
        print(
            f"SUMMARY run {run.pk}: {state}; {sum(tr.state == 'succeeded' for tr in summary.task_runs)}/"
            f"{len(summary.task_runs)} tasks succeeded; retried: {', '.join(f'{k} (attempt {n})' for k, n in retried) or 'none'}; "
            f"duration {duration:.2f} s" if duration is not None else f"SUMMARY run {run.pk}: {state}"
        )
        report = (summary.task_runs and next((tr.output for tr in summary.task_runs if tr.task.key == "report"), None))
        if isinstance(report, dict) and report.get("path"):
            print(f"report written to {report['path']}")
        if args.mode == "demo":
            return 0 if ok else 1
        print(f"serving at http://{args.bind}/ — Ctrl-C stops web, workers and clock")
        while not interrupted:
            if not web.alive():
                print(f"web server exited; stopping (see {web.log_path})", file=sys.stderr)
                return 1
            time.sleep(0.5)
        return 0
    finally:
        print("stopping web, workers and clock ...")
        stack.stop_all()


if __name__ == "__main__":
    sys.exit(main())
