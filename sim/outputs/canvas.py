"""Figures drawn on :class:`matplotlib.figure.Figure` objects, never through pyplot.

pyplot keeps a global list of figures and a process-wide backend; a library module that forced the
Agg backend switched a notebook kernel off its inline figures. A ``Figure`` made
here needs no backend to be saved, and a notebook displays it as any other figure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def subplots(
    nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float] | None = None, **kwargs: Any
) -> tuple[Figure, Any]:
    """``(figure, axes)`` as ``pyplot.subplots`` returns them (``kwargs``: ``sharex``, ``squeeze``,
    ``width_ratios``...), on a figure pyplot does not track."""
    # matplotlib is imported on first draw (~0.6 s): a plan's driver reads figure jobs from this
    # package but leaves the drawing to its workers.
    from matplotlib.figure import Figure

    figure = Figure(figsize=figsize)
    return figure, figure.subplots(nrows, ncols, **kwargs)
