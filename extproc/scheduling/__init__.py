"""Endpoint scheduling inside a pool."""

from extproc.scheduling.least_inflight import LeastInFlightPicker

__all__ = ["LeastInFlightPicker"]
