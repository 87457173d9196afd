"""Reading one metric series in a test without a registry collection (importable as ``metric_reads``,
like ``loop_fakes``).

``REGISTRY.get_sample_value`` collects every metric family of the process with every label set ever
created in it: ~0.2-1.3 ms on a fresh registry, ~10 ms once one run of the replica-image hypothesis test
had left its 94 per-example label sets behind (before they were dropped with each example), and more
with every test that creates nodes of its own on the same worker."""

from __future__ import annotations

from prometheus_client import Counter, Gauge
from prometheus_client.metrics import MetricWrapperBase


def series_value(family: Gauge | Counter, **labels: str) -> float:
    """The current value of one gauge or counter series, read from its own child: O(1) however many
    label sets the family holds.  A series not created yet is created at 0 (what the node creating it
    starts from)."""
    value: float = family.labels(**labels)._value.get()
    return value


def family_sample(family: MetricWrapperBase, name: str, **labels: str) -> float | None:
    """The sample ``name`` (a histogram's ``…_count`` or ``…_sum`` too) with exactly ``labels`` from one
    family: walks that family's label sets only, not the registry's; None when absent (as
    ``get_sample_value``)."""
    for metric in family.collect():
        for sample in metric.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None
