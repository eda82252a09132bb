// The extension's settings, as the Settings Editor shows them ("MLX engine"): their schema is
// schema/plugin.json, and these defaults are what the extension uses where the Lab has no setting
// registry (tests/settings.test.ts keeps the two the same). No Lab imports: unit-tested with jest.
import { ReadonlyPartialJSONObject } from '@lumino/coreutils';
import { IPoll } from '@lumino/polling';

/** JupyterLab finds the settings schema by the plugin's id: this one's is schema/plugin.json. */
export const PLUGIN_ID = 'mlx-nb-labextension:plugin';

export interface Settings {
  /** Milliseconds between status polls while the engine answers. */
  pollInterval: number;
  /** The most milliseconds between polls while it does not (the poll backs off up to this). */
  pollBackoffLimit: number;
  /** How many of the latest requests the sidebar's batch timeline draws. */
  timelineLanes: number;
  /** Most tokens the sidebar chat asks for in one answer. */
  chatMaxTokens: number;
}

export const DEFAULT_SETTINGS: Readonly<Settings> = {
  pollInterval: 1000,
  pollBackoffLimit: 10000,
  timelineLanes: 12,
  chatMaxTokens: 512
};

/** The settings from the registry's composite (user values over the schema's defaults). The
 * registry has validated them against the schema; a key it lacks keeps the default. */
export function readSettings(composite: ReadonlyPartialJSONObject): Settings {
  const read = (key: keyof Settings): number => {
    const value = composite[key];
    return typeof value === 'number' ? value : DEFAULT_SETTINGS[key];
  };
  return {
    pollInterval: read('pollInterval'),
    pollBackoffLimit: read('pollBackoffLimit'),
    timelineLanes: read('timelineLanes'),
    chatMaxTokens: read('chatMaxTokens')
  };
}

/** The status poll's frequency: the interval while the engine answers; after each failure a
 * longer wait (Poll's randomized exponential back-off), never past the limit, and never shorter
 * than the interval (Poll refuses a limit below it). */
export function pollFrequency(settings: Settings): IPoll.Frequency {
  return {
    interval: settings.pollInterval,
    backoff: true,
    max: Math.max(settings.pollInterval, settings.pollBackoffLimit)
  };
}
