"""The penguins-report example (examples/penguins.yaml): its task functions called in
sequence, as the engine would, checked against figures computed here straight from the
CSV with the csv module. No database: these are plain functions."""

from __future__ import annotations

import csv
import dataclasses
import json
import statistics
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from engine.definitions import parse_document, validate_document
from engine.handlers import REGISTRY, TaskContext
from examples.penguins import tasks

EXAMPLES = Path(django_settings.BASE_DIR) / "examples"
CSV_PATH = EXAMPLES / "data" / "penguins.csv"
MEASUREMENTS = ("bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g")


@dataclasses.dataclass
class FakeContext:
    attempt: int = 1
    workflow_run_id: uuid.UUID = dataclasses.field(default_factory=uuid.uuid4)


# ------------------------------------------------------------------ independent figures


def raw_rows() -> list[dict[str, str]]:
    with CSV_PATH.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def complete_rows() -> list[dict[str, str]]:
    return [r for r in raw_rows() if all(r[m] != "NA" for m in (*MEASUREMENTS, "sex"))]


def mean_mass(rows, **where) -> float:
    return statistics.mean(float(r["body_mass_g"]) for r in rows if all(r[k] == v for k, v in where.items()))


# ------------------------------------------------------------------ the pipeline


def roundtrip(value):
    """What the engine does to an output before a dependent sees it."""
    return json.loads(json.dumps(value))


def run_until_transforms(input=None):
    extracted = roundtrip(tasks.extract(input or {}, {}))
    validated = roundtrip(tasks.validate(input or {}, {"extract": extracted}))
    up = {"validate": validated}
    transforms = {
        "by_species": roundtrip(tasks.by_species({}, up)),
        "by_island": roundtrip(tasks.by_island({}, up, context=FakeContext(attempt=2))),
        "by_sex_year": roundtrip(tasks.by_sex_year({}, up)),
    }
    return extracted, validated, transforms


@pytest.fixture
def pipeline():
    extracted, validated, transforms = run_until_transforms()
    aggregated = roundtrip(tasks.aggregate({}, transforms))
    return {"extract": extracted, "validate": validated, **transforms, "aggregate": aggregated}


# ------------------------------------------------------------------ the data set


def test_dataset_is_the_full_palmer_penguins_table():
    rows = raw_rows()
    assert len(rows) == 344
    assert list(rows[0]) == [
        "species",
        "island",
        "bill_length_mm",
        "bill_depth_mm",
        "flipper_length_mm",
        "body_mass_g",
        "sex",
        "year",
    ]
    assert Counter(r["species"] for r in rows) == {"Adelie": 152, "Gentoo": 124, "Chinstrap": 68}


# ------------------------------------------------------------------ extract


def test_extract_types_every_row_and_maps_na_to_none():
    raw = raw_rows()
    out = tasks.extract({}, {})
    assert out["row_count"] == len(raw) == len(out["rows"])
    first = out["rows"][0]
    assert first == {
        "species": raw[0]["species"],
        "island": raw[0]["island"],
        "bill_length_mm": float(raw[0]["bill_length_mm"]),
        "bill_depth_mm": float(raw[0]["bill_depth_mm"]),
        "flipper_length_mm": int(raw[0]["flipper_length_mm"]),
        "body_mass_g": int(raw[0]["body_mass_g"]),
        "sex": raw[0]["sex"],
        "year": int(raw[0]["year"]),
    }
    assert isinstance(first["bill_length_mm"], float) and isinstance(first["body_mass_g"], int)
    for column in ("body_mass_g", "sex"):
        assert sum(r[column] is None for r in out["rows"]) == sum(r[column] == "NA" for r in raw)
    assert roundtrip(out) == out


def test_extract_limit():
    assert tasks.extract({"limit": 7}, {})["row_count"] == 7
    assert tasks.extract({"limit": 0}, {})["rows"] == []
    for bad in (-1, "10", 2.5, True):
        with pytest.raises(ValueError, match="limit"):
            tasks.extract({"limit": bad}, {})


# ------------------------------------------------------------------ validate


def test_validate_keeps_complete_rows_and_reports_why_others_were_dropped(pipeline):
    raw, complete = raw_rows(), complete_rows()
    out = pipeline["validate"]
    assert out["input_rows"] == 344
    assert out["kept"] == len(complete) == len(out["rows"]) == 333
    assert out["dropped"] == len(raw) - len(complete) == 11
    assert out["drop_reasons"]["missing sex"] == sum(r["sex"] == "NA" for r in raw)
    assert out["drop_reasons"]["missing body_mass_g"] == sum(r["body_mass_g"] == "NA" for r in raw)
    assert all(r[f] is not None for r in out["rows"] for f in (*MEASUREMENTS, "sex"))


def test_validate_fails_clearly_when_too_few_rows_survive():
    extracted = tasks.extract({"limit": 5}, {})
    with pytest.raises(ValueError, match=r"only \d+ of 5 rows .* at least 10"):
        tasks.validate({}, {"extract": extracted})


def test_validate_names_a_missing_dependency():
    with pytest.raises(ValueError, match="'extract'"):
        tasks.validate({}, {})


# ------------------------------------------------------------------ the fan-out


def test_by_species(pipeline):
    complete = complete_rows()
    out = pipeline["by_species"]
    assert out["species_count"] == len({r["species"] for r in complete}) == 3
    gentoo = out["species"]["Gentoo"]
    assert gentoo["count"] == sum(r["species"] == "Gentoo" for r in complete)
    assert round(gentoo["body_mass_g"]["mean"], 1) == round(mean_mass(complete, species="Gentoo"), 1)
    adelie_flippers = [int(r["flipper_length_mm"]) for r in complete if r["species"] == "Adelie"]
    assert out["species"]["Adelie"]["flipper_length_mm"]["min"] == min(adelie_flippers)
    assert out["species"]["Adelie"]["flipper_length_mm"]["max"] == max(adelie_flippers)
    chinstrap_bills = [float(r["bill_length_mm"]) for r in complete if r["species"] == "Chinstrap"]
    assert out["species"]["Chinstrap"]["bill_length_mm"]["mean"] == pytest.approx(
        statistics.mean(chinstrap_bills), abs=0.005
    )
    assert round(gentoo["body_mass_g_by_sex"]["male"]["mean"], 1) == round(
        mean_mass(complete, species="Gentoo", sex="male"), 1
    )


def test_by_island_is_flaky_on_attempt_one_and_succeeds_on_attempt_two(pipeline):
    up = {"validate": pipeline["validate"]}
    with pytest.raises(RuntimeError, match="attempt 1"):
        tasks.by_island({}, up, context=FakeContext(attempt=1))
    out = tasks.by_island({}, up, context=FakeContext(attempt=2))
    assert out["attempt"] == 2
    mix = defaultdict(Counter)
    for r in complete_rows():
        mix[r["island"]][r["species"]] += 1
    assert {name: i["species"] for name, i in out["islands"].items()} == {k: dict(v) for k, v in mix.items()}
    assert out["islands"]["Torgersen"]["species_count"] == 1
    # outside the engine (no context) and with the flake switched off it does not fail
    assert tasks.by_island({}, up)["islands"] == out["islands"]
    assert (
        tasks.by_island({}, up, context=FakeContext(attempt=1), flaky_attempts=0)["islands"] == out["islands"]
    )


def test_by_sex_year(pipeline):
    complete = complete_rows()
    groups = {(g["sex"], g["year"]): g for g in pipeline["by_sex_year"]["groups"]}
    expected = Counter((r["sex"], int(r["year"])) for r in complete)
    assert {k: g["count"] for k, g in groups.items()} == dict(expected)
    assert round(groups[("female", 2008)]["mean_body_mass_g"], 1) == round(
        mean_mass(complete, sex="female", year="2008"), 1
    )


# ------------------------------------------------------------------ fan-in and report


def test_aggregate(pipeline):
    complete = complete_rows()
    out = pipeline["aggregate"]
    species = sorted({r["species"] for r in complete})
    means = {s: mean_mass(complete, species=s) for s in species}
    assert out["penguins"] == len(complete)
    assert out["heaviest_species"]["species"] == max(means, key=means.get) == "Gentoo"
    assert out["lightest_species"]["species"] == min(means, key=means.get)
    islands = defaultdict(set)
    for r in complete:
        islands[r["island"]].add(r["species"])
    most = max(len(v) for v in islands.values())
    assert out["islands_with_most_species"] == {
        "islands": sorted(k for k, v in islands.items() if len(v) == most),
        "species_count": most,
    }
    for s in species:
        ratio = mean_mass(complete, species=s, sex="male") / mean_mass(complete, species=s, sex="female")
        assert out["dimorphism"][s]["ratio"] == pytest.approx(ratio, abs=0.001)
    assert set(out["dimorphism_by_year"]) == {"2007", "2008", "2009"}


def test_aggregate_rejects_transforms_that_disagree(pipeline):
    up = {k: pipeline[k] for k in ("by_species", "by_island", "by_sex_year")}
    up["by_sex_year"] = {**up["by_sex_year"], "groups": up["by_sex_year"]["groups"][1:]}
    with pytest.raises(ValueError, match="disagree"):
        tasks.aggregate({}, up)


def test_report_is_written_under_the_run_directory(pipeline, settings, tmp_path):
    settings.FLOWFORGE_REPORT_DIR = tmp_path
    context = FakeContext(attempt=1)
    out = tasks.report({}, {"aggregate": pipeline["aggregate"]}, context=context)
    path = Path(out["path"])
    assert path == tmp_path / str(context.workflow_run_id) / "penguins-report.md"
    assert out["bytes"] == path.stat().st_size > 0
    text = path.read_text(encoding="utf-8")
    for name in ("Adelie", "Chinstrap", "Gentoo", "Biscoe", "Dream", "Torgersen"):
        assert name in text
    assert str(context.workflow_run_id) in text
    assert f"{round(mean_mass(complete_rows(), species='Gentoo'), 1):,.1f}" in text
    # a retry rewrites the same file whole, and leaves no temporary file behind
    again = tasks.report({}, {"aggregate": pipeline["aggregate"]}, context=context)
    assert again == out
    assert [p.name for p in path.parent.iterdir()] == ["penguins-report.md"]


def test_report_rejects_a_filename_with_a_path(pipeline, settings, tmp_path):
    settings.FLOWFORGE_REPORT_DIR = tmp_path
    with pytest.raises(ValueError, match="plain file name"):
        tasks.report({}, {"aggregate": pipeline["aggregate"]}, filename="../escape.md")


# ------------------------------------------------------------------ the definitions


def test_definitions_validate():
    doc = validate_document(
        parse_document((EXAMPLES / "penguins.yaml").read_text(), filename="penguins.yaml")
    )
    by_key = {t["key"]: t for t in doc["tasks"]}
    assert doc["name"] == "penguins-report"
    assert by_key["aggregate"]["depends_on"] == ["by_species", "by_island", "by_sex_year"]
    assert by_key["by_island"]["max_attempts"] == 3 and by_key["by_island"]["retry_backoff_seconds"] == 0.5
    assert all(t["type"] == "python" and "position" in t for t in doc["tasks"])
    diamond = validate_document(
        parse_document((EXAMPLES / "diamond.json").read_text(), filename="diamond.json")
    )
    assert [t["key"] for t in diamond["tasks"]] == ["start", "fast", "slow", "join"]


def test_whole_workflow_through_the_python_handler(settings, tmp_path):
    """Run every task of penguins.yaml through the real `python` handler (config
    validation, allowlist, params, context injection) in dependency order, retrying
    as the engine would; outputs are JSON round-tripped between tasks."""
    settings.FLOWFORGE_REPORT_DIR = tmp_path
    doc = validate_document(
        parse_document((EXAMPLES / "penguins.yaml").read_text(), filename="penguins.yaml")
    )
    handler = REGISTRY["python"]
    run_id = uuid.uuid4()
    outputs: dict = {}
    attempts_used: dict = {}
    for task in doc["tasks"]:  # the document lists tasks in a dependency order
        assert handler.validate_config(task["config"]) == task["config"]
        for attempt in range(1, task["max_attempts"] + 1):
            context = TaskContext(
                task_run_id=uuid.uuid4(),
                workflow_run_id=run_id,
                organization_id=uuid.uuid4(),
                task_key=task["key"],
                attempt=attempt,
                max_attempts=task["max_attempts"],
                fencing_token=attempt,
                timeout_seconds=task["timeout_seconds"],
                config=task["config"],
                input={},
                upstream={d: outputs[d] for d in task["depends_on"]},
            )
            try:
                outputs[task["key"]] = roundtrip(handler.run(context))
            except RuntimeError:
                continue
            attempts_used[task["key"]] = attempt
            break
        assert task["key"] in outputs, f"{task['key']} failed every attempt"
    assert attempts_used["by_island"] == 2
    assert all(n == 1 for k, n in attempts_used.items() if k != "by_island")
    report_path = Path(outputs["report"]["path"])
    assert report_path == tmp_path / str(run_id) / "penguins-report.md"
    assert "Gentoo" in report_path.read_text(encoding="utf-8")
