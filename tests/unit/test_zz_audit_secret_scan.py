"""Runs last (tests/unit after tests/integration and e2e, and zz after every other
unit module): no secret the suite created reached any audit record's metadata."""

from __future__ import annotations

import pytest

from tests import secret_registry


def test_no_secret_the_suite_created_appears_in_any_audit_record(request):
    if request.session.testscollected < 100:
        pytest.skip("run with the whole suite: it checks what the other tests wrote")
    texts = secret_registry.AUDIT_TEXTS
    secrets = {s for s in secret_registry.SECRETS if len(s) >= 8}
    # The scan is meaningful only if the suite produced both secrets and audit records.
    assert len(secrets) >= 20, len(secrets)
    assert len(texts) >= 200, len(texts)
    leaks = sorted({s for s in secrets for t in texts if s in t})
    assert leaks == [], f"{len(leaks)} secret(s) found in audit metadata"
