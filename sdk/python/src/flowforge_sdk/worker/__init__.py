"""The worker runtime: ``Worker``, the ``TaskContext`` its handlers receive (see
flowforge_sdk.worker.runtime). ``python -m flowforge_sdk.worker module:attribute`` runs one."""

from flowforge_sdk.worker.context import TaskContext
from flowforge_sdk.worker.runtime import Worker

__all__ = ["TaskContext", "Worker"]
