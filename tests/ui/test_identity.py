"""A renamed notebook keeps its work in the browser: the panel's "This notebook" follows the new name.

A notebook created as ``Untitled.ipynb`` and renamed (the normal flow) runs a
small sweep: the panel's jobs, scoped to "This notebook", list its job under
the new name, and the job's cell link names the file that exists.  The
server re-keys what it holds (jupyter_cluster/server/renames.py) and the
front end tells the kernel (labextension/src/notebook/rename.ts).  Light and
dark screenshots of the panel go to test-artifacts/identity-panel-*.png.
"""

from __future__ import annotations

import os

import nbformat
import pytest

from .pages import RUN_ALL_WHEN_READY_JS, lab_page, notebook_ready, open_panel, shot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

CELLS = [
    "import jupyter_cluster as jc\n%load_ext jupyter_cluster\n%cluster start --name ui-renamed --workers 1 --threads 1",
    "%%parallel cfg in [{'lr': lr, 'seed': s} for lr in (1e-4, 1e-2) for s in (0, 1)]\n"
    "for step in range(3):\n    jc.report(step=step, topic='renamed', loss=cfg['lr'] * (3 - step) + cfg['seed'])",
    "from jupyter_cluster.tracking.kernel import notebook_path\nprint('KERNEL-SEES', notebook_path())",
]


def test_a_renamed_notebook_shows_its_jobs_under_the_new_name(lab, browser, artifacts):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.cells.append(nbformat.v4.new_code_cell("%cluster stop ui-renamed"))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, os.path.join(lab.root_dir, "Untitled.ipynb"))
    with lab_page(browser, lab, "lab/tree/Untitled.ipynb", artifacts=artifacts, last_shot="identity-last.png") as page:
        notebook_ready(page)
        # the user renames it before running (as JupyterLab's rename does: the document's context)
        page.evaluate(
            """async () => {
              const panel = window.jupyterapp.shell.currentWidget;
              await panel.sessionContext.ready;
              await panel.sessionContext.session.kernel.info;
              await panel.context.rename('sweep-renamed.ipynb');
            }"""
        )
        page.wait_for_function(
            "window.jupyterapp.shell.currentWidget.sessionContext.session?.path === 'sweep-renamed.ipynb'",
            timeout=30_000,
        )
        page.evaluate(RUN_ALL_WHEN_READY_JS, False)
        page.wait_for_function(
            "[...document.querySelectorAll('.jp-OutputArea-output')].some(o => o.textContent.includes('KERNEL-SEES'))",
            timeout=180_000,
        )
        seen = page.evaluate(
            "[...document.querySelectorAll('.jp-OutputArea-output')].map(o => o.textContent)"
            ".find(t => t.includes('KERNEL-SEES'))"
        )
        assert seen.strip().endswith("sweep-renamed.ipynb"), seen  # the kernel was told its new path

        open_panel(page)
        page.select_option("#jupyter-cluster-panel select.jc-jobs-scope", "notebook")
        jobs = page.locator("#jupyter-cluster-panel .jc-job")
        jobs.first.wait_for(timeout=60_000)
        contexts = page.locator("#jupyter-cluster-panel .jc-job-context").evaluate_all(
            "nodes => nodes.map(n => n.title + ' | ' + n.textContent)"
        )
        assert contexts and all("sweep-renamed.ipynb" in c and "Untitled" not in c for c in contexts), contexts
        shot(page, artifacts, "identity-panel-light.png", "#jupyter-cluster-panel")
        page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', { theme: 'JupyterLab Dark' })")
        page.wait_for_function("document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
        page.wait_for_timeout(500)
        shot(page, artifacts, "identity-panel-dark.png", "#jupyter-cluster-panel")
        page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', { theme: 'JupyterLab Light' })")
        page.wait_for_function("document.body.dataset.jpThemeLight === 'true'", timeout=30_000)
        page.evaluate(
            "window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.requestExecute({code: '%cluster stop ui-renamed'}).done"
        )
