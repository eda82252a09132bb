// JupyterLab's view of the one shared MLX engine: a status bar item, a sidebar of every live
// request with Abort and the batch timeline, and palette commands. One poll of the status route
// feeds them all (and, while the sidebar shows, one of the timeline picture). The poll backs off
// while the engine cannot be reached and stands by while the page is hidden; its interval, the
// timeline's lanes and the chat's answer length are settings (schema/plugin.json).
import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { ICompletionProviderManager } from '@jupyterlab/completer';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Poll } from '@lumino/polling';

import {
  abortRequest,
  clearPrefixCache,
  fetchBatchPicture,
  fetchCachePicture,
  fetchJobs,
  fetchStatus,
  fetchTrainings
} from './api';
import { EngineStatus } from './data';
import { ChatBox } from './chat';
import { EngineCompletions } from './completer';
import { Sidebar, StatusItem } from './panels';
import { DEFAULT_SETTINGS, PLUGIN_ID, pollFrequency, readSettings, Settings } from './settings';

const OPEN = 'mlx-nb:open-sidebar';
const ABORT_ALL = 'mlx-nb:abort-all';
const CLEAR_CACHE = 'mlx-nb:clear-prefix-cache';

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'The shared MLX engine in the Lab: status bar, sidebar, abort.',
  autoStart: true,
  requires: [ILabShell],
  optional: [IStatusBar, ICommandPalette, IRenderMimeRegistry, ICompletionProviderManager, ISettingRegistry],
  activate: (
    app: JupyterFrontEnd,
    shell: ILabShell,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    rendermime: IRenderMimeRegistry | null,
    completions: ICompletionProviderManager | null,
    settingRegistry: ISettingRegistry | null
  ) => {
    let settings: Settings = { ...DEFAULT_SETTINGS };
    const sidebar = new Sidebar();
    const chat = new ChatBox(rendermime);
    sidebar.addPart(chat);
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

    /** One tick: the status, then (sidebar showing) the pictures. It rejects when the engine
     * cannot be reached, which is what makes the poll back off. */
    const tick = async (): Promise<void> => {
      try {
        latest = await fetchStatus();
        item.show_(latest);
        sidebar.show_(latest);
        if (sidebar.isVisible && latest.ready) {
          sidebar.showJobs(await fetchJobs(), await fetchTrainings());
          sidebar.showTimeline(await fetchBatchPicture(settings.timelineLanes, sidebar.pictureWidth));
          if (sidebar.selected !== null) {
            sidebar.showCache(await fetchCachePicture(sidebar.selected, sidebar.pictureWidth));
          }
        }
      } catch (err) {
        latest = null;
        item.show_(null, String(err));
        sidebar.show_(null, String(err));
        throw err;
      }
    };
    const poll = new Poll({
      name: 'mlx-nb:engine-status',
      factory: tick,
      frequency: pollFrequency(settings),
      standby: 'when-hidden', // a tab in the background asks nothing of the engine
      auto: false // started once the settings are read, so the first ticks use them
    });
    const apply = (loaded: ISettingRegistry.ISettings): void => {
      settings = readSettings(loaded.composite);
      poll.frequency = pollFrequency(settings);
      chat.maxTokens = settings.chatMaxTokens;
    };
    /** Reads the settings and follows their changes, then starts polling: with the defaults
     * where the Lab has no setting registry or the settings cannot be read. */
    const start = async (): Promise<void> => {
      if (settingRegistry !== null) {
        try {
          const loaded = await settingRegistry.load(PLUGIN_ID);
          apply(loaded);
          loaded.changed.connect(() => {
            apply(loaded);
            void poll.refresh(); // now, not after the old interval (or a long back-off) runs out
          });
        } catch (reason) {
          console.warn(`${PLUGIN_ID}: its settings could not be read, so it uses its defaults`, reason);
        }
      }
      await poll.start();
    };
    void start();
  }
};

export default plugin;
