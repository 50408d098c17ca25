"""A GPU's ceilings: the share of a datasheet peak (memory bandwidth, matrix-product FLOP/s) that
real kernels were measured to reach on it, or a default from the measured parts of its kind with
their range. The bandwidth ceilings are in :mod:`sim.hardware.gpus`, the compute ceilings in
:mod:`sim.hardware.compute_ceilings`; both are this shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, TypeVar

MIN_DEFAULT_HALF_WIDTH = 0.05
"""A default's band reaches at least this far either side of its median: two parts do not pin a
technology or an architecture down."""


@dataclass(frozen=True)
class MeasuredShare:
    """A share of a datasheet peak: ``measured`` on the GPU itself (``source`` cites where), or a
    default whose ``low`` .. ``high`` is the range of the measured parts it stands for (the GPU's cost
    band widens by it)."""

    WHAT: ClassVar[str] = "share"
    """What the share is of, for error messages ("achievable bandwidth", ...)."""
    MAX_SHARE: ClassVar[float] = 1.0

    share: float
    source: str
    measured: bool = True
    low: float | None = None
    high: float | None = None

    def __post_init__(self) -> None:
        for name in ("share", "low", "high"):
            value = getattr(self, name)
            if value is None and name != "share":
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 < value <= self.MAX_SHARE
            ):
                raise ValueError(
                    f"{self.WHAT} {name} is a share of the datasheet, in (0, {self.MAX_SHARE:g}]; got {value!r}"
                )
        if self.low is not None and self.high is not None and not self.low <= self.share <= self.high:
            raise ValueError(f"{self.WHAT} {self.share} lies outside its own range {self.low}..{self.high}")

    @property
    def band(self) -> tuple[float, float]:
        """The shares the GPU may really reach: its measurement, or the measured parts' range."""
        return (self.low or self.share, self.high or self.share)


Share = TypeVar("Share", bound=MeasuredShare)


def median_of_measured(kind: type[Share], shares: dict[str, float], what: str, note: str = "") -> Share:
    """A default of ``kind`` for GPUs without a measurement: the median of the measured parts'
    ``shares`` (by part name), their range as its band, at least :data:`MIN_DEFAULT_HALF_WIDTH` either
    side and never past ``kind.MAX_SHARE``; ``what`` names the parts ("HBM3", "Hopper")."""
    values = sorted(shares.values())
    middle = len(values) // 2
    median = values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2
    low = min(values[0], median - MIN_DEFAULT_HALF_WIDTH)
    high = min(max(values[-1], median + MIN_DEFAULT_HALF_WIDTH), kind.MAX_SHARE)
    parts = ", ".join(f"{name} {share:.1%}" for name, share in shares.items())
    return kind(
        round(median, 3),
        f"no measurement of this GPU: the median of measured {what} parts{note}: {parts}",
        measured=False,
        low=round(low, 3),
        high=round(high, 3),
    )
