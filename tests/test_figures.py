"""The run figures (sim/figures.py) as a reader sees them: nothing cut off or squeezed, curves
that look like zero say so, and pools that differ between variants say why."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from sim import figures as plots
from sim.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The quickstart's three allocators (contiguous-max, paged, prefix-cow), 200 requests: every figure
    ``kvsim run`` draws, as laid out when saved, by file name."""
    drawn: dict[str, object] = {}
    save = plots._save

    def keep(figure, path, top=None):
        drawn[path.name] = figure
        return save(figure, path, top)

    out = tmp_path_factory.mktemp("run") / "out"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plots, "_save", keep)
        args = ["run", str(ROOT / "configs/quickstart.yaml"), "-q", "-o", str(out)]
        assert main([*args, "--set", "workload.num_requests=200"]) == 0
    assert (out / "figures" / "oom_preemptions.png").is_file()
    return drawn


def renderer_of(figure):
    """A renderer to measure ``figure``'s artists with (it was saved without a pyplot canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    return FigureCanvasAgg(figure).get_renderer()


def texts(figure) -> list:
    """Every title, axis label and legend of ``figure``."""
    found = [figure._suptitle] if figure._suptitle is not None else []
    for axis in figure.axes:
        found += [axis.title, axis._left_title, axis._right_title, axis.xaxis.label, axis.yaxis.label]
        if axis.get_legend() is not None:
            found.append(axis.get_legend())
    found += figure.legends
    return [text for text in found if getattr(text, "get_text", lambda: "x")() != ""]


def test_no_title_label_or_legend_is_cut_off(figures):
    for name, figure in figures.items():
        renderer = renderer_of(figure)
        box = figure.bbox
        for text in texts(figure):
            extent = text.get_window_extent(renderer)
            inside = extent.x0 >= box.x0 - 1 and extent.x1 <= box.x1 + 1 and extent.y0 >= box.y0 - 1
            what = text.get_text() if hasattr(text, "get_text") else type(text).__name__
            assert inside and extent.y1 <= box.y1 + 1, f"{name}: {what!r} reaches past the figure"


def test_the_oom_legend_sits_below_the_axes_and_leaves_them_the_width(figures):
    figure = figures["oom_preemptions.png"]
    (axis,) = figure.axes
    renderer = renderer_of(figure)
    legend = axis.get_legend().get_window_extent(renderer)
    axes = axis.get_window_extent(renderer)
    assert len(axis.get_legend().get_texts()) == 9
    assert legend.y1 < axes.y0, "below the axes, not over them"
    assert axes.width > 0.7 * figure.bbox.width  # beside them, the legend left it 40 %


def test_curves_that_look_like_zero_say_so(figures):
    (axis,) = figures["fragmentation.png"].axes
    labels = {text.get_text().split(" (")[0]: text.get_text() for text in axis.get_legend().get_texts()}
    assert labels["contiguous-max"] == "contiguous-max"  # most of its pool is fragmented
    for variant in ("paged", "prefix-cow"):  # a partial last block at most: far below 1 % of the axes
        assert re.fullmatch(rf"{variant} \(≈0 throughout, at most \d[\d.]* %\)", labels[variant])
    (axis,) = figures["oom_preemptions.png"].axes
    assert "prefix-cow: OOM failures (0 throughout)" in [
        text.get_text() for text in axis.get_legend().get_texts()
    ]


def test_a_contiguous_pool_one_slot_larger_is_explained_in_the_title(figures):
    (axis,) = figures["utilization.png"].axes
    assert axis.get_title().splitlines()[1:] == [
        "KV pool 458,096 tokens in whole 16-token blocks, 55.9 GiB",
        "(contiguous-max: 458,097, every slot: a contiguous pool has no blocks)",
    ]
    assert [text.get_text() for text in axis.get_legend().get_texts()] == [
        "contiguous-max",
        "paged",
        "prefix-cow",
    ]


def summary(*rows: tuple[str, int, int]) -> pd.DataFrame:
    """``(variant, kv_pool_tokens, block_size)`` rows, 131,072 bytes per token, one replica."""
    return pd.DataFrame(
        [
            {
                "variant": variant,
                "kv_pool_tokens": tokens,
                "kv_pool_bytes": tokens * 131_072,
                "kv_bytes_per_token": 131_072,
                "block_size": block,
                "replicas": 1,
            }
            for variant, tokens, block in rows
        ]
    )


def test_pools_that_are_not_one_memory_go_into_the_legend():
    same = plots.describe_pools(summary(("a", 4096, 16), ("b", 4096, 16)))
    assert same.title == "KV pool 4,096 tokens, 0.5 GiB" and same.legend_label("a") == "a"
    # 4,100 slots hold 256 whole blocks of 16: the same memory as 4,096 tokens in blocks.
    rounded = plots.describe_pools(summary(("contiguous", 4100, 16), ("paged", 4096, 16)))
    assert rounded.title is not None and rounded.title.endswith(
        "(contiguous: 4,100, every slot: a contiguous pool has no blocks)"
    )
    # Another block size, or more memory: different pools, each named in its legend entry.
    for other in (("paged", 4096, 32), ("paged", 8192, 16)):
        different = plots.describe_pools(summary(("contiguous", 4100, 16), other))
        assert different.title is None
        assert different.legend_label("contiguous") == "contiguous (pool 4,100 tokens, 0.5 GiB)"


def test_a_plan_driver_lists_its_figures_without_importing_matplotlib() -> None:
    """A plan's workers draw its report's figures; the driver only lists them (and matplotlib's
    ~0.6 s of imports would sit between the last round and the report)."""
    import subprocess
    import sys

    code = (
        "import sys; from sim.planning.report.figures import plan_figure_jobs; "
        "from sim.planning.report.plan_report import report_blocks; "
        "print('matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"]
