"""flowforge.jsonb.stored_bytes: the size of JSON text as PostgreSQL's jsonb keeps and
serves it, compared with PostgreSQL's own count."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from engine.worker.output import OutputTooLarge, encode_output
from flowforge.jsonb import stored_bytes


@pytest.mark.django_db
@pytest.mark.parametrize("value", [
    1e308, -1.7976931348623157e308, 1e-300, -2.5e-300, 1.5e-07, 1e16, 123456789.125, 0.1, 0, -7, 10**40,
    "1e308 in a string stays 5 characters", "quote \" then 2e5", "é", "🙂",
])
def test_a_scalar_is_counted_as_postgresql_stores_it(value):
    text = json.dumps(value, ensure_ascii=False)
    with connection.cursor() as cur:
        cur.execute("SELECT octet_length((%s::jsonb)::text)", [text])
        assert stored_bytes(text) == cur.fetchone()[0]


@pytest.mark.django_db
def test_a_structure_is_counted_as_stored_less_the_spaces_postgresql_adds():
    value = {"a": [1e308, "x1e5", {"b": 2.5e-10}], "c": "\\"}
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    with connection.cursor() as cur:
        cur.execute("SELECT octet_length((%s::jsonb)::text)", [text])
        # PostgreSQL writes ", " and ": ": 3 commas and 3 colons here.
        assert stored_bytes(text) == cur.fetchone()[0] - 6


def test_a_task_output_over_its_cap_as_stored_fails_the_task_naming_the_size():
    # [ + 4 numbers of 309 digits + 3 ", " + ] = 1244 bytes, as json.dumps and PostgreSQL both write it.
    with pytest.raises(OutputTooLarge, match=r"task output is 1244 bytes of JSON, over FLOWFORGE_MAX_OUTPUT_BYTES "
                                             r"\(1000\)"):
        encode_output([1e308] * 4, limit_bytes=1000)
    assert encode_output([1e308] * 3, limit_bytes=1000) == "[1e+308, 1e+308, 1e+308]"
