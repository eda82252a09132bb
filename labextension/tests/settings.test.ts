// The settings schema (what the Settings Editor shows and the registry validates) against the
// defaults the code falls back on, and the poll frequency the settings make.
import schema from '../schema/plugin.json';
import { DEFAULT_SETTINGS, pollFrequency, readSettings, Settings } from '../src/settings';

describe('the settings schema', () => {
  it('names every setting the code reads, with the same defaults', () => {
    expect(Object.keys(schema.properties).sort()).toEqual(Object.keys(DEFAULT_SETTINGS).sort());
    for (const [key, property] of Object.entries(schema.properties)) {
      expect([key, property.default]).toEqual([key, DEFAULT_SETTINGS[key as keyof Settings]]);
    }
  });

  it('keeps the defaults the extension had as constants', () => {
    expect(DEFAULT_SETTINGS.pollInterval).toBe(1000);
    expect(DEFAULT_SETTINGS.timelineLanes).toBe(12);
    expect(DEFAULT_SETTINGS.chatMaxTokens).toBe(512);
  });
});

describe('readSettings', () => {
  it('takes the registry composite, keeping the default for a key it lacks', () => {
    expect(readSettings({ pollInterval: 250, timelineLanes: 3 })).toEqual({
      ...DEFAULT_SETTINGS,
      pollInterval: 250,
      timelineLanes: 3
    });
    expect(readSettings({})).toEqual(DEFAULT_SETTINGS);
  });
});

describe('pollFrequency', () => {
  it('polls at the interval and backs off up to the limit', () => {
    expect(pollFrequency({ ...DEFAULT_SETTINGS, pollInterval: 500, pollBackoffLimit: 8000 })).toEqual({
      interval: 500,
      backoff: true,
      max: 8000
    });
  });

  it('never sets a limit below the interval (Poll refuses one)', () => {
    expect(pollFrequency({ ...DEFAULT_SETTINGS, pollInterval: 60000, pollBackoffLimit: 10000 }).max).toBe(60000);
  });
});
