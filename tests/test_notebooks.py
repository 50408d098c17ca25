"""The notebooks are stored without outputs and run from top to bottom on the shipped small configs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_the_notebooks_are_there():
    assert [path.name for path in NOTEBOOKS] == [
        "01_policy_comparison.ipynb",
        "02_capacity_planning.ipynb",
        "03_trace_explorer.ipynb",
        "04_hybrid_allocators.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_is_stored_without_outputs(path):
    notebook = json.loads(path.read_text())
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, cell["source"][:80]


# A cell draws when it shows pyplot's figures or one of kvsim's figure functions' (``knee_figure(...)``).
DRAWS = re.compile(r"\bplt\.show\(\)|\b\w+_figure\(")
KVSIM_FIGURES = re.compile(r"\b\w+_figure\(")


@pytest.mark.timeout(300)  # a kernel running its own small experiments: 10-25 s, more on loaded cores
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_executes_and_shows_its_figures(path, tmp_path, monkeypatch):
    """Run top to bottom as a person would, with the kernel's own (inline) backend: the suite's
    MPLBACKEND=Agg would hide a cell that draws and shows nothing. Every drawing cell must put an
    image in its outputs (one per kvsim figure function it calls)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    # The kernel inherits the environment: results go to a temporary folder, never to results/.
    monkeypatch.setenv("KVSIM_NOTEBOOK_RESULTS", str(tmp_path))
    monkeypatch.delenv("MPLBACKEND", raising=False)
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    errors = [
        output for cell in code for output in cell.get("outputs", []) if output.get("output_type") == "error"
    ]
    assert errors == []
    missing = []
    for cell in code:
        if not DRAWS.search(cell.source):
            continue
        images = sum("image/png" in output.get("data", {}) for output in cell.get("outputs", []))
        if images < max(1, len(KVSIM_FIGURES.findall(cell.source))):
            missing.append(f"{images} image(s) from: {cell.source[:120]!r}")
    assert missing == []


def test_drawing_modules_leave_the_backend_alone():
    """A notebook kernel's inline backend must survive importing kvsim's figure modules and drawing
    with them (they draw on Figure objects, never through pyplot's process-wide backend)."""
    import subprocess
    import sys

    script = (
        "import matplotlib; matplotlib.use('svg')\n"
        "import sim.figures, sim.planning.report.figures, sim.replay.figures, sim.validation\n"
        "from sim.outputs.canvas import subplots\n"
        "figure, axes = subplots(1, 2, figsize=(4, 2)); axes[0].plot([0, 1])\n"
        "import io; figure.savefig(io.BytesIO(), format='png')\n"
        "assert matplotlib.get_backend() == 'svg', matplotlib.get_backend()\n"
        "import matplotlib.pyplot as plt; assert plt.get_fignums() == []  # pyplot tracks none of them\n"
    )
    env = {key: value for key, value in __import__("os").environ.items() if key != "MPLBACKEND"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
