"""Prometheus text as samples keyed by name and labels, for the tests that read /metrics."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parsed(text: str | bytes) -> Samples:
    """Prometheus text as {(sample name, sorted labels): value}."""
    text = text.decode() if isinstance(text, bytes) else text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
