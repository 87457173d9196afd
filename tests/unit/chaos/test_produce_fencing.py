"""Fenced periods derived from the monitor's samples."""

from __future__ import annotations

from chaos.checkers import ClusterSample, FencingInterval
from chaos.produce import fencing_intervals


def test_intervals_span_first_to_last_fenced_sample_per_broker() -> None:
    samples = [
        ClusterSample(1, 1, {101: False, 102: False}),
        ClusterSample(2, 1, {101: True, 102: False}),
        ClusterSample(3, None, {}),  # no active controller: says nothing about brokers
        ClusterSample(4, 2, {101: True, 102: True}),
        ClusterSample(5, 2, {101: False, 102: True}),
    ]
    assert sorted(fencing_intervals(samples), key=lambda i: i.broker_id) == [
        FencingInterval(101, 2, 4),
        FencingInterval(102, 4, 5),  # still fenced at the end of the samples
    ]


def test_no_fencing_no_intervals() -> None:
    assert fencing_intervals([ClusterSample(1, 1, {101: False})]) == []
