"""The reconcile report's arithmetic: writes in flight are not drift, until a drain that
should have applied them has not."""

from __future__ import annotations

from shared.reconcile.service import ReconcileReport


def test_writes_in_flight_count_as_drift_once_a_drain_has_not_applied_them() -> None:
    report = ReconcileReport()
    report.drift["orphaned"] = {"c"}
    report.in_flight = {"a", "b"}
    report.in_flight_drift["missing"] = {"a"}
    report.in_flight_drift["stale"] = {"b"}
    assert report.total() == 1 and report.as_dict()["in_flight"] == 2

    report.count_as_drift({"a"})  # a's repair was drained and is still waiting
    assert report.drift["missing"] == {"a"} and report.in_flight == {"b"}
    assert report.total() == 2 and report.as_dict()["counts"]["missing"] == 1
    report.count_as_drift({"x"})  # not in flight: nothing changes
    assert report.total() == 2 and report.in_flight == {"b"}
