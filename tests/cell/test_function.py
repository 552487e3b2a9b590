"""The cell function: a ``%%parallel`` cell as one value, its run tag a field of its own (no cluster needed)."""

from __future__ import annotations

import cloudpickle

from jupyter_cluster.cell.function import CellFunction
from jupyter_cluster.engine.worker.run import PreparedCell
from jupyter_cluster.telemetry.tags import current_item
from jupyter_cluster.tracking.tags import ItemTag


def test_the_run_tag_travels_as_a_field_of_the_cell_not_among_its_values():
    tag = ItemTag("run-7", "lr")
    cell = CellFunction(
        "seen.append(current_item())\nlr * 2",
        targets="lr",
        small={"seen": cloudpickle.dumps([]), "current_item": cloudpickle.dumps(current_item)},
        tag=tag,
    )
    assert set(cell.small) == {"seen", "current_item"}  # nothing of the run among the captured values
    on_worker = cloudpickle.loads(cloudpickle.dumps(cell))  # as a worker gets it
    assert on_worker.tag.run == "run-7" and on_worker.tag.sweep
    prepared = PreparedCell.of(on_worker)
    run_item = prepared.bind(None)
    assert run_item(0.5) == 1.0
    assert prepared.values["seen"] == [("run-7", "lr=0.5", {"lr": 0.5})]  # report() there names run and item
    assert current_item() is None  # the item ended

    untagged = PreparedCell.of(CellFunction("x + 1", targets="x"))
    assert untagged.tag is None and untagged.bind(None)(1) == 2
