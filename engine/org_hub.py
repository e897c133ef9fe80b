"""One LISTEN connection per process that wakes the open home pages and run lists of an
organization when one of its runs is created or changes state (issue 20).

The triggers ``workflowrun_org_insert_notify`` / ``workflowrun_org_state_notify`` (engine
migration 0030) raise ``pg_notify('flowforge_org_runs', '<organization id>:runs')`` at the
commit of every such change. The machinery is engine.queue_hub's (register before reading,
reconnect with backoff and wake everyone, close when idle), on its own channel and
connection: ``wait_for(organization_id)`` returns a QueueWait whose ``wait(timeout)`` says
whether the organization's runs changed since the last call. The notification only says
"look": the page reads the runs itself.
"""

from __future__ import annotations

import os
import threading
import uuid

from engine.queue_hub import QueueHub, QueueWait

#: The channel of the triggers of engine migration 0030.
CHANNEL = "flowforge_org_runs"
APPLICATION_NAME = "flowforge-org-hub"
#: The payload's second part (``<organization id>:runs``).
TOPIC = "runs"

_hub: QueueHub | None = None
_hub_lock = threading.Lock()


def hub() -> QueueHub:
    """This process's hub of organizations' run changes (a new one in a forked child)."""
    global _hub
    with _hub_lock:
        if _hub is None or _hub.pid != os.getpid():
            _hub = QueueHub(channel=CHANNEL, application_name=APPLICATION_NAME)
        return _hub


def wait_for(organization_id: uuid.UUID) -> QueueWait:
    """A wait on ``organization_id``'s run changes, returned once the hub LISTENs (or after
    engine.queue_hub.READY_TIMEOUT_SECONDS: it is then not ``live`` and the caller polls).
    The caller closes it."""
    return hub().wait_for(organization_id, TOPIC)
