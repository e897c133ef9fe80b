"""Settings of the test suite: the deployment's settings plus the suite's own task callables.

pytest uses this module (pyproject's DJANGO_SETTINGS_MODULE), and the worker, clock and web
processes the suite starts inherit it through the environment; a deployment never loads it,
so nothing under tests/ is a task callable there.
"""

from flowforge.settings import *  # noqa: F403
from flowforge.settings import FLOWFORGE_TASK_CALLABLES as _DEPLOYMENT_CALLABLES

FLOWFORGE_TASK_CALLABLES = [
    *_DEPLOYMENT_CALLABLES,
    "tests.callables.echo",  # tests/unit/test_handlers.py, tests/unit/test_definitions.py
    "tests.callables.schedule_of",  # tests/unit/test_cron_dates.py, tests/integration/test_cron_clock.py
    "tests.faults.tasks.kill_own_worker",  # the fault suite's self_killing_task scenario
    # Issue 19: what an attempt logs, prints and raises (tests/unit/test_attempt_logs.py,
    # tests/integration/test_task_logs.py, tests/e2e/test_browser_task_panel.py).
    "tests.callables.log_print_raise",
    "tests.callables.print_key",
    "tests.callables.chatty",
    "tests.callables.slow_logger",
    # Issue 21: an output over the task-run row's cap (tests/integration/test_offload.py).
    "tests.callables.big_output",
]

# The unit tests follow one transition at a time: a new run's roots stay ready until the
# test claims them (the scheduler's path). tests/unit/test_claim_on_start.py and the
# integration suite (tests/integration/conftest.py) run with the deployment's default, on.
FLOWFORGE_CLAIM_ON_START = env_bool("FLOWFORGE_CLAIM_ON_START", False)  # noqa: F405

# The integration tests' failure emails, sent by worker processes: written as files to this
# directory when it is set (tests/integration/test_notifications.py), so the test can read them.
if os.environ.get("FLOWFORGE_TEST_MAIL_DIR"):  # noqa: F405
    MAILERS = {"default": {"BACKEND": "django.core.mail.backends.filebased.EmailBackend",
                           "OPTIONS": {"file_path": os.environ["FLOWFORGE_TEST_MAIL_DIR"]}}}  # noqa: F405
