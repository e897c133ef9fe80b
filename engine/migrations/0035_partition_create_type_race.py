"""``ff_history_partition_create`` also reads "type already exists" as "another manager got
there first".

``CREATE TABLE`` checks the new relation's name, then its row type's name. When a concurrent
manager commits the same partition between those two checks, the loser fails on the second
one, with ``duplicate_object`` (42710: ``type "core_tasklog_p…" already exists``), which
0033's function did not catch: a clock's housekeeping raised instead of returning NULL (seen
once in CI, test_two_managers_at_once_create_each_partition_exactly_once).

The function is replaced whole from 0033's text with that one condition added; reversing
puts 0033's back. Owner, SECURITY DEFINER and grants are kept by ``CREATE OR REPLACE``.
"""

from __future__ import annotations

import importlib

from django.db import migrations

_0033 = importlib.import_module("engine.migrations.0033_history_partitions")

# 0033's CREATE FUNCTION statement for ff_history_partition_create, alone.
_OLD = _0033.FUNCTIONS.split("CREATE FUNCTION ff_history_partition_drop")[0].strip()
_CAUGHT = "EXCEPTION WHEN duplicate_table OR invalid_object_definition OR unique_violation OR lock_not_available THEN"
assert _OLD.startswith("CREATE FUNCTION ff_history_partition_create") and _OLD.count(_CAUGHT) == 1

OLD = _OLD.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
NEW = OLD.replace(_CAUGHT, _CAUGHT.replace("unique_violation OR", "unique_violation OR duplicate_object OR"))


class Migration(migrations.Migration):

    dependencies = [
        ('engine', '0034_created_by_api_key'),
    ]

    operations = [
        migrations.RunSQL(NEW, reverse_sql=OLD),
    ]
