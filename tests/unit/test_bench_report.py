"""The bench's report helpers (pure functions; the live scenarios run in the smoke test)."""

from bench.run import median_round


def _round(ratio: float) -> dict:
    return {"engine": {"tasks_per_s": ratio * 1000}, "baseline": {"messages_per_s": 1000.0}, "ratio": ratio}


def test_median_round_reports_the_middle_round_and_every_ratio_in_measured_order():
    assert median_round([_round(0.19), _round(0.12), _round(0.16)]) == {**_round(0.16), "rounds": [0.19, 0.12, 0.16]}


def test_median_round_of_an_even_number_takes_the_lower_middle_round():
    assert median_round([_round(0.2), _round(0.1)])["ratio"] == 0.1
    assert median_round([_round(0.3), _round(0.1), _round(0.4), _round(0.2)])["ratio"] == 0.2


def test_median_round_of_one_round_is_that_round():
    assert median_round([_round(0.25)]) == {**_round(0.25), "rounds": [0.25]}
