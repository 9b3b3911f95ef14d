"""Executes notebooks/layouts.ipynb on the CPU with nbclient and checks its pictures and the numbers it prints."""

import base64
import time
from pathlib import Path

import pytest

# The test extra installs both; a bare GPU box without them skips the notebook instead of failing collection.
nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "layouts.ipynb"


@pytest.fixture(scope="module")
def executed():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    t = time.perf_counter()
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    return nb, time.perf_counter() - t


def outputs(nb):
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def test_notebook_runs_without_error_in_under_a_minute(executed):
    nb, seconds = executed
    assert not [o for o in outputs(nb) if o.output_type == "error"]
    assert all(c.execution_count for c in nb.cells if c.cell_type == "code")
    assert seconds < 60


def test_notebook_draws_its_pictures(executed):
    nb, _ = executed
    pngs = [base64.b64decode(o.data["image/png"]) for o in outputs(nb) if "image/png" in o.get("data", {})]
    assert len(pngs) >= 4  # the atom, the CTA map, the access patterns, the unit slices
    assert all(p[:8] == b"\x89PNG\r\n\x1a\n" and len(p) > 20_000 for p in pngs)


def test_notebook_prints_the_layout_numbers(executed):
    nb, _ = executed
    text = "".join(o.text for o in outputs(nb) if o.output_type == "stream")
    assert "slab 0 spans bytes 0..16383 (16384 distinct = 512 * K/64 = 16384)" in text
    # One warp's scale load for one K step (K = 2048 config: 4 values of r, 8 lanes along K): 4 r x 4 row groups x
    # 4 scale groups x 4 columns = 256 bytes, in 64-byte runs when permuted, one 16-byte row piece each when plain.
    assert "permuted: 256 bytes, 8 sectors, 4 contiguous runs" in text
    assert "plain: 256 bytes, 16 sectors, 16 contiguous runs" in text
    # The TMA kernel's scale copies: every quarter's slice of every atom is one 128-byte run.
    assert "unit slices: 2 blocks x 4 quarters x 32 groups, each 128 contiguous bytes" in text


def test_committed_notebook_has_cell_ids_and_its_pictures_stored(executed):
    """The file as committed, unexecuted: every cell has an id (nbformat 4.5), and every picture the notebook draws
    is stored, so it reads on GitHub without running."""
    import json

    raw = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    assert (raw["nbformat"], raw["nbformat_minor"]) >= (4, 5)
    ids = [c.get("id") for c in raw["cells"]]
    assert all(ids) and len(set(ids)) == len(ids)

    def pngs(cells):
        return [i for i, c in enumerate(cells) for o in c.get("outputs", []) if "image/png" in o.get("data", {})]

    nb, _ = executed
    assert pngs(raw["cells"]) == pngs(nb.cells) and len(pngs(nb.cells)) >= 4
