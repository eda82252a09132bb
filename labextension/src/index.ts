// JupyterLab's view of the one shared MLX engine: a status bar item, a sidebar of every live
// request with Abort and the batch timeline, and palette commands. One poll of the status route
// feeds them all (and, while the sidebar shows, one of the timeline picture).
import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { ICompletionProviderManager } from '@jupyterlab/completer';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { IStatusBar } from '@jupyterlab/statusbar';

import { abortRequest, clearPrefixCache, fetchBatchPicture, fetchCachePicture, fetchStatus } from './api';
import { EngineStatus } from './data';
import { ChatBox } from './chat';
import { EngineCompletions } from './completer';
import { Sidebar, StatusItem, TIMELINE_LANES } from './panels';

const POLL_MS = 1000;
const OPEN = 'mlx-nb:open-sidebar';
const ABORT_ALL = 'mlx-nb:abort-all';
const CLEAR_CACHE = 'mlx-nb:clear-prefix-cache';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'mlx-nb-labextension:plugin',
  description: 'The shared MLX engine in the Lab: status bar, sidebar, abort.',
  autoStart: true,
  requires: [ILabShell],
  optional: [IStatusBar, ICommandPalette, IRenderMimeRegistry, ICompletionProviderManager],
  activate: (
    app: JupyterFrontEnd,
    shell: ILabShell,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    rendermime: IRenderMimeRegistry | null,
    completions: ICompletionProviderManager | null
  ) => {
    const sidebar = new Sidebar();
    sidebar.addPart(new ChatBox(rendermime).node);
    shell.add(sidebar, 'right', { rank: 900 });
    let latest: EngineStatus | null = null;
    completions?.registerInlineProvider(new EngineCompletions(() => Boolean(latest?.fill_in_the_middle)));

    app.commands.addCommand(OPEN, {
      label: 'MLX: Open the engine sidebar',
      execute: () => shell.activateById(sidebar.id)
    });
    app.commands.addCommand(ABORT_ALL, {
      label: 'MLX: Abort every running request',
      execute: async () => {
        await Promise.all((latest?.requests ?? []).map(r => abortRequest(r.id)));
      }
    });
    app.commands.addCommand(CLEAR_CACHE, {
      label: 'MLX: Clear the prefix cache',
      execute: () => clearPrefixCache()
    });
    for (const command of [OPEN, ABORT_ALL, CLEAR_CACHE]) {
      palette?.addItem({ command, category: 'MLX' });
    }

    const item = new StatusItem(() => void app.commands.execute(OPEN));
    statusBar?.registerStatusItem('mlx-nb-labextension:status', { item, align: 'left', rank: 100 });

    const poll = async (): Promise<void> => {
      try {
        latest = await fetchStatus();
        item.show_(latest);
        sidebar.show_(latest);
        if (sidebar.isVisible && latest.ready) {
          sidebar.showTimeline(await fetchBatchPicture(TIMELINE_LANES, sidebar.pictureWidth));
          if (sidebar.selected !== null) {
            sidebar.showCache(await fetchCachePicture(sidebar.selected, sidebar.pictureWidth));
          }
        }
      } catch (err) {
        latest = null;
        item.show_(null, String(err));
        sidebar.show_(null, String(err));
      }
      window.setTimeout(() => void poll(), POLL_MS);
    };
    void poll();
  }
};

export default plugin;
