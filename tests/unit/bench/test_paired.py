from extproc.bench.paired import paired_difference, tracing_report


def test_paired_difference_is_per_round_and_skips_empty_rounds() -> None:
    got = paired_difference([1.5, 1.2, None, 1.0], [1.4, 1.3, 1.0, 0.9])
    assert got["per_round_ms"] == [0.1, -0.1, 0.1]
    assert got["rounds"] == 3 and got["rounds_positive"] == 2
    assert got["median_ms"] == 0.1 and got["min_ms"] == -0.1 and got["max_ms"] == 0.1
    assert paired_difference([None], [1.0]) == {"rounds": 0}


def test_tracing_report_compares_the_traced_variant_with_its_control() -> None:
    report: dict[str, object] = {}
    added = {"with_extproc": {"p50": 0.5, "p99": 1.0}, "with_extproc+tracing": {"p50": 0.56, "p99": 1.2}}
    rounds: dict[str, list[float | None]] = {"with_extproc": [1.0, 1.1], "with_extproc+tracing": [1.05, 1.12]}
    tracing_report(report, added, rounds, "with_extproc", 7, 0.01)
    assert report["tracing_minus_off_ms"] == {"p50": 0.06, "p99": 0.2}
    assert report["tracing_minus_off_p50_per_round"]["per_round_ms"] == [0.05, 0.02]  # type: ignore[index]
    assert report["spans_exported"] == 7


def test_traced_variants_are_compared_with_their_tracing_off_twin() -> None:
    report: dict[str, object] = {}
    added = {"with_extproc": {"p50": 0.5, "p99": 1.0}, "with_extproc+tracing-off": {"p50": 0.8, "p99": 1.5},
             "with_extproc+tracing": {"p50": 0.82, "p99": 1.4}}
    rounds: dict[str, list[float | None]] = {
        "with_extproc": [1.0, 1.0], "with_extproc+tracing-off": [1.3, 1.2], "with_extproc+tracing": [1.3, 1.25]}
    tracing_report(report, added, rounds, "with_extproc", 3, 0.01)
    assert report["tracing_minus_off_ms"] == {"p50": 0.02, "p99": -0.1}  # over the twin, not the first variant
    assert report["tracing_minus_off_p50_per_round"]["per_round_ms"] == [0.0, 0.05]  # type: ignore[index]
    assert report["twin_minus_first_ms"]["p50"] == 0.3  # type: ignore[index]
