"""tenancy.models.without_credentials: what a listing joins, without password or key hashes."""

from __future__ import annotations

import pytest
from django.core.exceptions import FieldDoesNotExist

from engine.models import TriggerBackfill, WorkflowRun
from tenancy.models import ApiKey, Membership, without_credentials


def sql_of(queryset) -> str:
    return str(queryset.query)


def test_a_joined_user_is_read_without_its_password_hash():
    sql = sql_of(without_credentials(Membership.objects.unscoped(), "user", "organization"))
    assert 'JOIN "core_user"' in sql and '"core_user"."email"' in sql
    assert '"core_user"."password"' not in sql
    # The organization is joined whole: it holds no credential.
    assert '"core_organization"."slug"' in sql


def test_a_key_list_reads_neither_its_own_hashes_nor_its_authors_password():
    sql = sql_of(without_credentials(ApiKey.objects.unscoped(), "created_by", "revoked_by"))
    assert '"core_apikey"."prefix"' in sql and '"core_apikey"."hashed_key"' not in sql
    assert sql.count('JOIN "core_user"') == 2 and '"password"' not in sql


def test_a_run_list_joins_its_key_and_its_user_without_their_hashes():
    sql = sql_of(without_credentials(WorkflowRun.objects.unscoped(), "api_key", "triggered_by", "workflow"))
    assert 'JOIN "core_apikey"' in sql and '"core_apikey"."name"' in sql
    assert "hashed_key" not in sql and '"password"' not in sql


def test_a_nested_path_defers_the_credential_at_its_end():
    sql = sql_of(without_credentials(TriggerBackfill.objects.unscoped(), "trigger__created_by", "created_by"))
    assert sql.count('JOIN "core_user"') == 2 and '"password"' not in sql
    assert '"core_scheduledtrigger"."cron_expression"' in sql


def test_a_path_that_names_no_relation_is_refused():
    with pytest.raises(FieldDoesNotExist):
        without_credentials(Membership.objects.unscoped(), "owner")
