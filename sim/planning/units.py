"""Numbers as a planner reads them, always with their unit."""

from __future__ import annotations


def rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g} req/s"


def seconds(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "n/a"
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {unit}".strip()


def metric_value(name: str, value: float | None) -> str:
    """Format by the metric's name suffix (``_per_s``, ``_s``, ``_frac``)."""
    if name.endswith("_per_s"):
        return number(value, "tokens/s" if "tokens" in name else "req/s")
    if name.endswith("_s"):
        return seconds(value)
    if name.endswith("_frac"):
        return share(value)
    if name.endswith("_per_request"):
        return number(value, "tokens/request" if "tokens" in name else "per request")
    return number(value)
