"""Payloads kept outside the hot tables (issue 21): a task output over the task-run row's cap.

An attempt's output over FLOWFORGE_MAX_OUTPUT_BYTES (and within
FLOWFORGE_MAX_OFFLOADED_OUTPUT_BYTES) is written whole to the "offload" storage
(``settings.STORAGES``: the filesystem under var/offload by default, S3-compatible by
configuration, through Django's storage API and django-storages) and recorded in
``core_offloadedpayload``; the row's ``output`` holds only a summary, ``REF``::

    {"$ref": "offloaded_output", "bytes": 2097152, "sha256": "<64 hex>", "truncated": true}

which is what dependents receive as that upstream's output (as for an upstream over
FLOWFORGE_MAX_UPSTREAM_BYTES) and what the run's lists show; ``read_output`` gives the
whole JSON text back (the API's whole-output endpoint). Storage keys are built from ids
only (``outputs/<organization>/<run>/<task run>/<fencing token>.json``), never from task data.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from django.core.files.base import ContentFile
from django.core.files.storage import storages
from django.db import transaction

from engine.models import OffloadedPayload

REF = "offloaded_output"


class PayloadUnavailable(Exception):
    """An offloaded payload's bytes are missing from the storage or do not match their SHA-256."""


def storage():
    """The "offload" storage (settings.STORAGES["offload"])."""
    return storages["offload"]


def storage_key(*, organization_id: Any, workflow_run_id: Any, task_run_id: Any, fencing_token: int) -> str:
    """Where one generation's output goes: a path of ids only."""
    parts = [str(uuid.UUID(str(v))) for v in (organization_id, workflow_run_id, task_run_id)]
    return f"outputs/{parts[0]}/{parts[1]}/{parts[2]}/{int(fencing_token)}.json"


def offload_output(*, organization_id: Any, workflow_run_id: Any, task_run_id: Any, fencing_token: int,
                   text: str) -> str:
    """Write ``text`` (an output's JSON text) to the storage, record it, and return the
    summary JSON text to store in the task-run row instead (``REF``).

    The file is written before its row commits, so a row never points at nothing; a
    second write of the same generation (a redelivered message) replaces both. Raises
    the storage's OSError (or botocore's error) when the write fails: the attempt then
    fails as any handler error would, and is retried.
    """
    data = text.encode()
    digest = hashlib.sha256(data).hexdigest()
    key = storage_key(organization_id=organization_id, workflow_run_id=workflow_run_id,
                      task_run_id=task_run_id, fencing_token=fencing_token)
    store = storage()
    if store.exists(key):  # the same generation again (its first try's completion was lost)
        store.delete(key)
    saved = store.save(key, ContentFile(data))
    with transaction.atomic():
        OffloadedPayload.objects.unscoped().filter(task_run_id=task_run_id, fencing_token=fencing_token).delete()
        OffloadedPayload.objects.unscoped().create(
            organization_id=organization_id, workflow_run_id=workflow_run_id, task_run_id=task_run_id,
            fencing_token=fencing_token, storage_key=saved, size_bytes=len(data), sha256=digest)
    return json.dumps({"$ref": REF, "bytes": len(data), "sha256": digest, "truncated": True})


def payload_of(task_run: Any) -> OffloadedPayload | None:
    """The offloaded output of ``task_run``'s current generation (its ``fencing_token``),
    or None when its output is in the row. ``task_run`` needs ``pk``, ``organization_id``
    and ``fencing_token``."""
    return (OffloadedPayload.objects.for_organization(task_run.organization_id)
            .filter(task_run_id=task_run.pk, fencing_token=task_run.fencing_token).first())


def read_payload(payload: OffloadedPayload) -> str:
    """The whole JSON text of ``payload``. Raises PayloadUnavailable when the storage no
    longer has it or its bytes do not match the recorded SHA-256."""
    try:
        with storage().open(payload.storage_key, "rb") as fh:
            data = fh.read()
    except (OSError, FileNotFoundError) as exc:
        raise PayloadUnavailable(f"the offloaded output {payload.storage_key} cannot be read ({exc})") from None
    if hashlib.sha256(data).hexdigest() != payload.sha256:
        raise PayloadUnavailable(f"the offloaded output {payload.storage_key} does not match its SHA-256")
    return data.decode()


def delete_payloads(payloads: list[tuple[str, str]]) -> int:
    """Delete the files of ``payloads`` [(id, storage_key)] from the storage (a missing one
    counts as deleted). Returns how many files were deleted. The rows are the caller's."""
    store = storage()
    done = 0
    for _id, key in payloads:
        store.delete(key)
        done += 1
    return done


def is_ref(value: Any) -> bool:
    """Whether ``value`` (a stored output) has the shape of an offloaded output's summary.
    Only a shape: ``payload_of`` says whether the task run really has a payload."""
    return isinstance(value, dict) and value.get("$ref") == REF and isinstance(value.get("bytes"), int)
