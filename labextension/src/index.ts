/**
 * jupyter-cluster: registers the cluster sidebar, its palette commands and
 * settings.  Registration only; the panel lives in panel/.
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, IThemeManager, InputDialog, MainAreaWidget } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';

import { requestAPI } from './api';
import { connectCode } from './model';
import type { IClusterSummary, IJob } from './messages';
import { ClusterPanel, DEFAULT_SETTINGS, IPanelSettings, clusterIcon } from './panel';
import { followsRenames, renameCode } from './notebook/rename';
import { jobCell } from './panel/jobs';
import { OPEN_SWEEP, registerSweep } from './sweep/area';
import { TopicView } from './topicView';

const PLUGIN_ID = 'jupyter-cluster:plugin';

namespace CommandIDs {
  export const open = 'jupyter-cluster:open';
  export const start = 'jupyter-cluster:start';
  export const stop = 'jupyter-cluster:stop';
  export const scale = 'jupyter-cluster:scale';
  export const insertConnect = 'jupyter-cluster:insert-connect';
  export const openTopic = 'jupyter-cluster:open-topic';
}

/** The cluster named in the command's args, the panel's selection, or one the user picks. */
async function pickCluster(panel: ClusterPanel, args: { name?: unknown }, verb: string): Promise<string | null> {
  if (typeof args.name === 'string' && args.name) {
    return args.name;
  }
  const { clusters } = await requestAPI<{ clusters: IClusterSummary[] }>('clusters');
  const names = clusters.map(c => c.name);
  if (names.length === 0) {
    return null;
  }
  if (names.length === 1) {
    return names[0];
  }
  const current = panel.selected && names.includes(panel.selected) ? names.indexOf(panel.selected) : 0;
  const result = await InputDialog.getItem({ title: `Cluster to ${verb}`, items: names, current });
  return result.button.accept ? result.value : null;
}

function settingsFrom(settings: ISettingRegistry.ISettings): IPanelSettings {
  const rate = Number(settings.get('refreshRate').composite);
  const workers = settings.get('defaultWorkers').composite;
  return {
    refreshRate: Number.isFinite(rate) && rate > 0 ? rate : DEFAULT_SETTINGS.refreshRate,
    defaultWorkers: typeof workers === 'number' ? workers : null
  };
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Every Dask cluster on the machine: workers, map jobs and live metrics.',
  autoStart: true,
  optional: [ICommandPalette, ISettingRegistry, INotebookTracker, ILayoutRestorer, IThemeManager],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    settingRegistry: ISettingRegistry | null,
    notebooks: INotebookTracker | null,
    restorer: ILayoutRestorer | null,
    themes: IThemeManager | null
  ): void => {
    const panel = new ClusterPanel();
    app.shell.add(panel, 'left', { rank: 250 });
    restorer?.add(panel, 'jupyter-cluster-panel');

    // charts follow the theme, including those drawn before it changed
    const views = new Set<TopicView>();
    const dark = (): boolean | undefined => (themes?.theme ? !themes.isLight(themes.theme) : undefined);
    if (themes) {
      themes.themeChanged.connect((_, change) => {
        const isDark = !themes.isLight(change.newValue);
        panel.setDark(isDark);
        views.forEach(v => v.setDark(isDark));
        sweepDark(isDark);
      });
      if (themes.theme) {
        panel.setDark(!themes.isLight(themes.theme));
      }
    }

    const insertConnect = (name: string): void => {
      const current = notebooks?.currentWidget;
      if (!current) {
        console.warn('jupyter-cluster: no notebook is open to insert into');
        return;
      }
      const notebook = current.content;
      NotebookActions.insertAbove(notebook);
      notebook.activeCell?.model.sharedModel.setSource(connectCode(name));
      app.shell.activateById(current.id);
    };
    panel.onConnect = notebooks ? insertConnect : null;

    // a job's "cell" link: its notebook (opened if need be) with the cell that started it selected
    const openCell = async (job: IJob): Promise<void> => {
      const where = jobCell(job);
      if (!where || !notebooks) {
        return;
      }
      let widget = notebooks.find(w => w.context.path === where.notebook);
      if (!widget) {
        const opened = await app.commands.execute('docmanager:open', { path: where.notebook });
        widget = opened instanceof NotebookPanel ? opened : undefined;
      }
      if (!widget) {
        return;
      }
      app.shell.activateById(widget.id);
      await widget.context.ready;
      const notebook = widget.content;
      const cells = notebook.widgets;
      // the cell's id survives edits and moves; the execution count is the fallback
      let index = where.cellId ? cells.findIndex(c => c.model.id === where.cellId) : -1;
      if (index < 0 && where.count !== null) {
        index = cells.findIndex(
          c => c.model.type === 'code' && (c.model as { executionCount?: number | null }).executionCount === where.count
        );
      }
      if (index < 0) {
        console.warn(`jupyter-cluster: the cell of job ${job.job} is no longer in ${where.notebook}`);
        return;
      }
      notebook.deselectAll();
      notebook.activeCellIndex = index;
      await notebook.scrollToItem(index, 'center');
    };
    panel.onOpenCell = notebooks ? job => void openCell(job) : null;

    // a renamed notebook's kernel learns its new path (a silent execution; Python kernels only)
    const tellKernel = async (widget: NotebookPanel, oldPath: string, newPath: string): Promise<void> => {
      const kernel = widget.sessionContext.session?.kernel;
      if (!kernel || oldPath === newPath) {
        return;
      }
      try {
        const info = await kernel.info;
        if (followsRenames(info.language_info?.name)) {
          kernel.requestExecute({ code: renameCode(oldPath, newPath), silent: true, store_history: false });
        }
      } catch (err) {
        console.warn('jupyter-cluster: could not tell the kernel its notebook was renamed', err);
      }
    };

    // follow the active notebook's kernel to its cluster (the panel holds it when pinned)
    if (notebooks) {
      const follow = (): void => {
        const current = notebooks.currentWidget;
        panel.setActiveKernel(current?.sessionContext.session?.kernel?.id ?? null, current?.context.path ?? null);
      };
      const watched = new WeakSet<object>();
      const track = (): void => {
        const current = notebooks.currentWidget;
        if (current && !watched.has(current)) {
          watched.add(current);
          // a kernel started, restarted into a new id or changed by the user
          current.sessionContext.kernelChanged.connect(() => {
            if (notebooks.currentWidget === current) {
              follow();
            }
          });
          // renamed or moved: "This notebook" is its new path, and its kernel is told (the server follows itself)
          let path = current.context.path;
          current.context.pathChanged.connect((_, newPath) => {
            const oldPath = path;
            path = newPath;
            void tellKernel(current, oldPath, newPath);
            if (notebooks.currentWidget === current) {
              follow();
            }
          });
        }
        follow();
      };
      notebooks.currentChanged.connect(track);
      track();
    }

    const { commands } = app;
    commands.addCommand(CommandIDs.openTopic, {
      label: args => (args.topic ? `Open Metrics ${String(args.topic)} in the Main Area` : 'Open Metrics Topic'),
      execute: args => {
        const cluster = String(args.cluster ?? panel.selected ?? '');
        const topic = String(args.topic ?? '');
        if (!cluster || !topic) {
          return;
        }
        const content = new TopicView(cluster, topic, dark());
        const existing = [...views].find(v => v.id === content.id);
        if (existing) {
          content.dispose();
          app.shell.activateById(existing.parent?.id ?? existing.id);
          return;
        }
        const widget = new MainAreaWidget({ content });
        widget.id = `${content.id}-area`;
        widget.title.label = content.title.label;
        widget.title.icon = clusterIcon;
        views.add(content);
        content.disposed.connect(() => views.delete(content));
        app.shell.add(widget, 'main', { mode: 'split-right' });
        app.shell.activateById(widget.id);
      }
    });
    // the sweep table of a run in the main area (sweep/area.ts): command jupyter-cluster:open-sweep {run};
    // its tabs listen on the panel's events connection rather than open one each
    const sweepDark = registerSweep(app, palette, panel.feed, dark, clusterIcon);
    panel.onOpenSweep = run => void commands.execute(OPEN_SWEEP, { run });
    panel.onOpenTopic = (cluster, topic) => void commands.execute(CommandIDs.openTopic, { cluster, topic });
    // also in the View menu and the notebook's toolbar (schema/plugin.json): Notebook 7 has no sidebar tabs
    // until View → Left Sidebar is ticked, and activating the panel there opens its left area
    commands.addCommand(CommandIDs.open, {
      label: args => (args.toolbar ? '' : 'Show the Dask Clusters Panel'),
      caption: 'Show the Dask Clusters panel: clusters, workers, maps and metrics',
      icon: clusterIcon,
      execute: () => app.shell.activateById(panel.id)
    });
    commands.addCommand(CommandIDs.start, {
      label: 'Start a Dask Cluster…',
      execute: () => panel.newCluster()
    });
    commands.addCommand(CommandIDs.stop, {
      label: 'Stop a Dask Cluster…',
      execute: async args => {
        const name = await pickCluster(panel, args, 'stop');
        if (name) {
          await panel.stopCluster(name);
        }
      }
    });
    commands.addCommand(CommandIDs.scale, {
      label: 'Scale a Dask Cluster…',
      execute: async args => {
        const name = await pickCluster(panel, args, 'scale');
        if (name) {
          await panel.scaleCluster(name, typeof args.workers === 'number' ? args.workers : undefined);
        }
      }
    });
    commands.addCommand(CommandIDs.insertConnect, {
      label: 'Insert %cluster connect Into the Notebook',
      isEnabled: () => !!notebooks?.currentWidget,
      execute: async args => {
        const name = await pickCluster(panel, args, 'connect to');
        if (name) {
          insertConnect(name);
        }
      }
    });
    if (palette) {
      const category = 'Dask Clusters';
      for (const command of Object.values(CommandIDs).filter(c => c !== CommandIDs.openTopic)) {
        palette.addItem({ command, category });
      }
    }

    if (settingRegistry) {
      void settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          panel.configure(settingsFrom(settings));
          settings.changed.connect(() => panel.configure(settingsFrom(settings)));
        })
        .catch(reason => console.error('jupyter-cluster: settings failed to load', reason));
    }
  }
};

export default plugin;
