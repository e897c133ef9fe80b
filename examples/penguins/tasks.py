"""Task functions of the ``penguins-report`` example workflow (``examples/penguins.yaml``).

Each one is a ``python`` task: the worker calls ``fn(input, upstream, **params)``,
adding ``context=`` (the attempt's TaskContext) when the function declares it.
``input`` is the run's input document, ``upstream`` maps each dependency's task key
to its output. Every function returns a JSON-shaped value, which becomes the task's
output and the ``upstream`` entry of the tasks that depend on it.

The DAG::

    extract -> validate -> by_species  -> aggregate -> report
                       \\-> by_island   -/
                       \\-> by_sex_year -/

The data is the Palmer Penguins table in ``examples/data/penguins.csv`` (CC0, see
``examples/data/README.md``). Only the standard library is used.
"""

from __future__ import annotations

import csv
import os
import statistics
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from django.conf import settings

DATA_PATH = Path(__file__).resolve().parent.parent / "data" / "penguins.csv"

#: Column name -> type of its non-missing values, in file order.
COLUMNS: dict[str, type] = {
    "species": str,
    "island": str,
    "bill_length_mm": float,
    "bill_depth_mm": float,
    "flipper_length_mm": int,
    "body_mass_g": int,
    "sex": str,
    "year": int,
}
MEASUREMENTS = ("bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g")
MISSING = {"NA", ""}
REPORT_FILENAME = "penguins-report.md"


# --------------------------------------------------------------------------- helpers


def _upstream(upstream: dict[str, Any] | None, key: str) -> dict[str, Any]:
    """Return ``upstream[key]`` or raise ValueError saying which dependency is missing."""
    value = (upstream or {}).get(key)
    if not isinstance(value, dict):
        raise ValueError(
            f"expected the output of task {key!r} in upstream (got keys {sorted(upstream or {})}); "
            f"does this task depend on {key!r}?"
        )
    if value.get("truncated"):
        raise ValueError(
            f"the output of task {key!r} was truncated (FLOWFORGE_MAX_OUTPUT_BYTES); lower input.limit"
        )
    return value


def _rows(upstream: dict[str, Any] | None, key: str = "validate") -> list[dict[str, Any]]:
    rows = _upstream(upstream, key).get("rows")
    if not isinstance(rows, list):
        raise ValueError(f"the output of task {key!r} has no 'rows' list")
    return rows


def _convert(column: str, raw: str, line: int) -> Any:
    if raw.strip() in MISSING:
        return None
    kind = COLUMNS[column]
    try:
        return kind(raw) if kind is not str else raw.strip()
    except ValueError:
        raise ValueError(f"{DATA_PATH.name} line {line}: {column}={raw!r} is not a {kind.__name__}") from None


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "mean": round(statistics.fmean(values), 2),
        "min": min(values),
        "max": max(values),
    }


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 2) if values else None


# --------------------------------------------------------------------------- tasks


def extract(input: dict[str, Any] | None, upstream: dict[str, Any] | None) -> dict[str, Any]:
    """Read ``examples/data/penguins.csv`` into typed rows.

    Numbers become ``float`` (bill length/depth) or ``int`` (flipper length, body
    mass, year); ``NA`` becomes ``None``. ``input["limit"]`` (optional, a whole
    number >= 0) keeps only the first N rows.

    Returns ``{"source", "columns", "row_count", "rows": [{column: value}, ...]}``.
    """
    limit = (input or {}).get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"input.limit must be a whole number >= 0, got {limit!r}")
    rows: list[dict[str, Any]] = []
    with DATA_PATH.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames != list(COLUMNS):
            raise ValueError(f"{DATA_PATH.name}: expected columns {list(COLUMNS)}, got {reader.fieldnames}")
        for record in reader:
            if limit is not None and len(rows) >= limit:
                break
            line = reader.line_num
            rows.append({col: _convert(col, record[col], line) for col in COLUMNS})
    return {
        "source": f"examples/data/{DATA_PATH.name}",
        "columns": list(COLUMNS),
        "row_count": len(rows),
        "rows": rows,
    }


def validate(
    input: dict[str, Any] | None, upstream: dict[str, Any] | None, *, min_rows: int = 10
) -> dict[str, Any]:
    """Keep the rows of ``upstream["extract"]`` that have all four body measurements
    (bill length, bill depth, flipper length, body mass) and a sex.

    Returns ``{"input_rows", "kept", "dropped", "drop_reasons", "rows"}``, where
    ``drop_reasons`` counts, per missing field, the dropped rows that lack it (a row
    missing several fields counts under each). Raises ValueError when fewer than
    ``min_rows`` (param, default 10) rows survive: the statistics downstream would
    mean nothing.
    """
    rows = _rows(upstream, "extract")
    required = (*MEASUREMENTS, "sex")
    clean: list[dict[str, Any]] = []
    reasons: Counter[str] = Counter()
    for row in rows:
        missing = [field for field in required if row.get(field) is None]
        if missing:
            reasons.update(f"missing {field}" for field in missing)
        else:
            clean.append(row)
    if len(clean) < min_rows:
        raise ValueError(
            f"only {len(clean)} of {len(rows)} rows have every measurement and sex; "
            f"at least {min_rows} are needed (dropped: {dict(sorted(reasons.items())) or 'none'})"
        )
    return {
        "input_rows": len(rows),
        "kept": len(clean),
        "dropped": len(rows) - len(clean),
        "drop_reasons": dict(sorted(reasons.items())),
        "rows": clean,
    }


def by_species(input: dict[str, Any] | None, upstream: dict[str, Any] | None) -> dict[str, Any]:
    """Per species: count, and mean/min/max of bill length, bill depth, flipper
    length and body mass; plus count and mean body mass per sex (for the
    dimorphism ratio in ``aggregate``). Reads ``upstream["validate"]``.

    Returns ``{"rows", "species_count", "species": {name: {...}}}``.
    """
    rows = _rows(upstream)
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[row["species"]].append(row)
    species: dict[str, Any] = {}
    for name in sorted(groups):
        members = groups[name]
        entry: dict[str, Any] = {"count": len(members)}
        for m in MEASUREMENTS:
            entry[m] = _summary([r[m] for r in members])
        by_sex: dict[str, Any] = {}
        for sex in sorted({r["sex"] for r in members}):
            masses = [r["body_mass_g"] for r in members if r["sex"] == sex]
            by_sex[sex] = {"count": len(masses), "mean": _mean(masses)}
        entry["body_mass_g_by_sex"] = by_sex
        species[name] = entry
    return {"rows": len(rows), "species_count": len(species), "species": species}


def by_island(
    input: dict[str, Any] | None,
    upstream: dict[str, Any] | None,
    *,
    context: Any = None,
    flaky_attempts: int = 1,
) -> dict[str, Any]:
    """Per island: count of penguins and the species mix (count per species).

    **Flaky on purpose, to demonstrate retries:** it raises RuntimeError on attempts
    1..``flaky_attempts`` (param, default 1: it fails attempt 1 and succeeds on
    attempt 2), read from ``context.attempt``. Its task therefore needs
    ``max_attempts`` >= ``flaky_attempts`` + 1. Called without a context (outside
    the engine) it does not fail. Set ``flaky_attempts: 0`` to turn the flake off.

    Returns ``{"rows", "island_count", "islands": {name: {"count", "species_count",
    "species": {species: count}}}, "attempt"}``.
    """
    attempt = getattr(context, "attempt", None)
    if attempt is not None and attempt <= flaky_attempts:
        raise RuntimeError(
            f"by_island is flaky on purpose: failing attempt {attempt} of the first {flaky_attempts} "
            "(the engine retries it)"
        )
    rows = _rows(upstream)
    mix: dict[str, Counter[str]] = defaultdict(Counter)
    for row in rows:
        mix[row["island"]][row["species"]] += 1
    islands = {
        name: {
            "count": sum(mix[name].values()),
            "species_count": len(mix[name]),
            "species": dict(sorted(mix[name].items())),
        }
        for name in sorted(mix)
    }
    return {"rows": len(rows), "island_count": len(islands), "islands": islands, "attempt": attempt}


def by_sex_year(input: dict[str, Any] | None, upstream: dict[str, Any] | None) -> dict[str, Any]:
    """Per sex x year: count and mean body mass (g). Reads ``upstream["validate"]``.

    Returns ``{"rows", "groups": [{"sex", "year", "count", "mean_body_mass_g"}, ...]}``
    ordered by sex then year.
    """
    rows = _rows(upstream)
    masses: dict[tuple[str, int], list[int]] = defaultdict(list)
    for row in rows:
        masses[(row["sex"], row["year"])].append(row["body_mass_g"])
    groups = [
        {"sex": sex, "year": year, "count": len(values), "mean_body_mass_g": _mean(values)}
        for (sex, year), values in sorted(masses.items())
    ]
    return {"rows": len(rows), "groups": groups}


def aggregate(input: dict[str, Any] | None, upstream: dict[str, Any] | None) -> dict[str, Any]:
    """Fan-in: combine ``by_species``, ``by_island`` and ``by_sex_year`` into one summary.

    Checks that the three transforms saw the same number of penguins (ValueError if
    not), then derives: the heaviest and lightest species (mean body mass), the
    island(s) with the most species (ties are all listed), the sexual dimorphism
    ratio of body mass per species (mean male / mean female) and per year. The
    three input tables are carried along for the report.
    """
    species_out = _upstream(upstream, "by_species")
    island_out = _upstream(upstream, "by_island")
    sex_year_out = _upstream(upstream, "by_sex_year")
    species = species_out["species"]
    islands = island_out["islands"]
    groups = sex_year_out["groups"]

    totals = {
        "by_species": sum(s["count"] for s in species.values()),
        "by_island": sum(i["count"] for i in islands.values()),
        "by_sex_year": sum(g["count"] for g in groups),
    }
    if len(set(totals.values())) != 1:
        raise ValueError(f"the transforms disagree on the number of penguins: {totals}")

    by_mass = sorted(species, key=lambda name: species[name]["body_mass_g"]["mean"])
    heaviest, lightest = by_mass[-1], by_mass[0]
    most = max(i["species_count"] for i in islands.values())

    dimorphism: dict[str, Any] = {}
    for name in sorted(species):
        sexes = species[name]["body_mass_g_by_sex"]
        male, female = sexes.get("male", {}).get("mean"), sexes.get("female", {}).get("mean")
        dimorphism[name] = {
            "male_mean_g": male,
            "female_mean_g": female,
            "ratio": round(male / female, 3) if male and female else None,
        }
    ratios = {name: d["ratio"] for name, d in dimorphism.items() if d["ratio"] is not None}

    per_year: dict[int, dict[str, Any]] = defaultdict(dict)
    for g in groups:
        per_year[g["year"]][g["sex"]] = g["mean_body_mass_g"]
    dimorphism_by_year = {
        str(year): {
            "male_mean_g": means.get("male"),
            "female_mean_g": means.get("female"),
            "ratio": round(means["male"] / means["female"], 3)
            if means.get("male") and means.get("female")
            else None,
        }
        for year, means in sorted(per_year.items())
    }

    return {
        "penguins": totals["by_species"],
        "species_count": len(species),
        "island_count": len(islands),
        "heaviest_species": {
            "species": heaviest,
            "mean_body_mass_g": species[heaviest]["body_mass_g"]["mean"],
        },
        "lightest_species": {
            "species": lightest,
            "mean_body_mass_g": species[lightest]["body_mass_g"]["mean"],
        },
        "islands_with_most_species": {
            "islands": sorted(n for n, i in islands.items() if i["species_count"] == most),
            "species_count": most,
        },
        "dimorphism": dimorphism,
        "most_dimorphic_species": max(ratios, key=lambda n: ratios[n]) if ratios else None,
        "dimorphism_by_year": dimorphism_by_year,
        "tables": {"species": species, "islands": islands, "sex_year": groups},
    }


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(_fmt(c) if not isinstance(c, str) else c for c in row) + " |" for row in rows]
    return out + [""]


def render_report(summary: dict[str, Any], *, run_id: str) -> str:
    """Render the ``aggregate`` output as a Markdown document."""
    t = summary["tables"]
    heaviest, lightest = summary["heaviest_species"], summary["lightest_species"]
    most = summary["islands_with_most_species"]
    lines = [
        "# Palmer penguins report",
        "",
        f"Workflow run `{run_id}`.",
        "",
        "## Summary",
        "",
        f"- Penguins with complete measurements: **{summary['penguins']}**",
        f"- Species: **{summary['species_count']}** ({', '.join(t['species'])})",
        f"- Islands: **{summary['island_count']}** ({', '.join(t['islands'])})",
        f"- Heaviest species: **{heaviest['species']}** ({_fmt(heaviest['mean_body_mass_g'])} g on average)",
        f"- Lightest species: **{lightest['species']}** ({_fmt(lightest['mean_body_mass_g'])} g on average)",
        f"- Island(s) with the most species ({most['species_count']}): **{', '.join(most['islands'])}**",
        f"- Most sexually dimorphic species (body mass): **{summary['most_dimorphic_species']}**",
        "",
        "## Measurements by species",
        "",
        "Mean (min–max).",
        "",
    ]

    def cell(stats: dict[str, Any]) -> str:
        return f"{_fmt(stats['mean'])} ({_fmt(stats['min'])}–{_fmt(stats['max'])})"

    lines += _table(
        ["species", "n", "bill length (mm)", "bill depth (mm)", "flipper length (mm)", "body mass (g)"],
        [[name, s["count"], *(cell(s[m]) for m in MEASUREMENTS)] for name, s in t["species"].items()],
    )
    lines += ["## Sexual dimorphism of body mass", ""]
    lines += _table(
        ["species", "male mean (g)", "female mean (g)", "male / female"],
        [
            [name, d["male_mean_g"], d["female_mean_g"], "–" if d["ratio"] is None else f"{d['ratio']:.3f}"]
            for name, d in summary["dimorphism"].items()
        ],
    )
    lines += _table(
        ["year", "male mean (g)", "female mean (g)", "male / female"],
        [
            [year, d["male_mean_g"], d["female_mean_g"], "–" if d["ratio"] is None else f"{d['ratio']:.3f}"]
            for year, d in summary["dimorphism_by_year"].items()
        ],
    )
    lines += ["## Islands", ""]
    lines += _table(
        ["island", "n", "species mix"],
        [
            [name, i["count"], ", ".join(f"{sp} {n}" for sp, n in i["species"].items())]
            for name, i in t["islands"].items()
        ],
    )
    lines += ["## Body mass by sex and year", ""]
    lines += _table(
        ["sex", "year", "n", "mean body mass (g)"],
        [[g["sex"], str(g["year"]), g["count"], g["mean_body_mass_g"]] for g in t["sex_year"]],
    )
    lines += [
        "---",
        "",
        "Data: Palmer Penguins (Horst, Hill & Gorman, *palmerpenguins*, CC0), collected by "
        "Dr. Kristen Gorman and the Palmer Station Long Term Ecological Research Program.",
        "",
    ]
    return "\n".join(lines)


def report(
    input: dict[str, Any] | None,
    upstream: dict[str, Any] | None,
    *,
    context: Any = None,
    filename: str = REPORT_FILENAME,
) -> dict[str, Any]:
    """Write the Markdown report of ``upstream["aggregate"]`` to
    ``<FLOWFORGE_REPORT_DIR>/<workflow_run_id>/<filename>`` (``filename`` param,
    default ``penguins-report.md``), creating the directories.

    The file is written to a temporary name and renamed into place, so a retried
    attempt replaces it whole and a reader never sees half a report. Without a
    context (outside the engine) the run directory is ``local``.

    Returns ``{"path": str, "bytes": int}``.
    """
    if not filename or Path(filename).name != filename or filename.startswith("."):
        raise ValueError(f"filename must be a plain file name, got {filename!r}")
    summary = _upstream(upstream, "aggregate")
    run_id = str(getattr(context, "workflow_run_id", None) or "local")
    directory = Path(settings.FLOWFORGE_REPORT_DIR) / run_id
    directory.mkdir(parents=True, exist_ok=True)
    data = render_report(summary, run_id=run_id).encode("utf-8")
    path = directory / filename
    tmp = directory / f".{filename}.{uuid.uuid4().hex}.tmp"
    try:
        with tmp.open("xb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return {"path": str(path), "bytes": len(data)}
