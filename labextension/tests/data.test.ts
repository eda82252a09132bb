// What the browser tests do not reach: every engine state the status bar can name, the queue
// count, and the SVG cleaning against hostile pictures.
import {
  cleanSvg,
  completionAsk,
  interactive,
  jobLines,
  EngineStatus,
  modelLines,
  othersLoaded,
  pictureWidth,
  shortName,
  stateOf,
  trainLines,
  waiting
} from '../src/data';

const base: EngineStatus = { model: 'm', ready: true, loading: false, requests: [] };

describe('stateOf', () => {
  it('names loading with its progress, ready, starting and error', () => {
    expect(stateOf({ ...base, ready: false, loading: true, load: { done: 3, total: 4 } })).toBe('loading 75%');
    expect(stateOf({ ...base, ready: false, loading: true, load: null })).toBe('loading');
    expect(stateOf(base)).toBe('ready');
    expect(stateOf({ ...base, ready: false })).toBe('starting');
    expect(stateOf({ ...base, ready: false, error: 'no such model' })).toBe('error');
  });
});

describe('waiting', () => {
  it('counts queued and prefilling requests, not decoding ones', () => {
    const r = (phase: string) => ({ id: phase, phase, prompt_tokens: 1, generated_tokens: 0, max_tokens: 8 });
    expect(waiting({ ...base, requests: [r('queued'), r('prefill'), r('decode'), r('decode')] })).toBe(2);
    expect(waiting({ ...base, requests: undefined })).toBe(0);
  });
});

describe('cleanSvg', () => {
  it('keeps the picture and its text', () => {
    const svg = cleanSvg('<svg xmlns="http://www.w3.org/2000/svg" class="mlx-batch"><g class="lane"><text>hi</text></g></svg>');
    expect(svg).not.toBeNull();
    expect(svg!.querySelectorAll('g.lane')).toHaveLength(1);
    expect(svg!.textContent).toBe('hi');
  });

  it('drops scripts, foreign objects, handlers and script URLs', () => {
    const svg = cleanSvg(
      '<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)">' +
        '<script>alert(2)</script>' +
        '<foreignObject><div xmlns="http://www.w3.org/1999/xhtml">x</div></foreignObject>' +
        '<a href=" JavaScript:alert(3)"><rect onclick="alert(4)" width="1" height="1"/></a>' +
        '<text>kept</text></svg>'
    );
    expect(svg).not.toBeNull();
    const html = svg!.outerHTML.toLowerCase();
    expect(html).not.toContain('script>');
    expect(html).not.toContain('alert');
    expect(html).not.toContain('foreignobject');
    expect(svg!.querySelector('rect')).not.toBeNull();
    expect(svg!.textContent).toBe('kept');
  });

  it('refuses what is not an SVG', () => {
    expect(cleanSvg('<html><body>no</body></html>')).toBeNull();
    expect(cleanSvg('not xml at all <')).toBeNull();
  });
});

describe('shortName', () => {
  it('names a model served from a folder by the folder', () => {
    expect(shortName('/tmp/models/long-llama')).toBe('long-llama');
    expect(shortName('/tmp/models/long-llama/')).toBe('long-llama');
    expect(shortName('smollm2-135m-instruct')).toBe('smollm2-135m-instruct');
  });
});

describe('pictureWidth', () => {
  it('draws for the panel within the server range, and the usual width while hidden', () => {
    expect(pictureWidth(320)).toBe(320);
    expect(pictureWidth(319.6)).toBe(319);
    expect(pictureWidth(120)).toBe(160);
    expect(pictureWidth(5000)).toBe(2000);
    expect(pictureWidth(0)).toBe(760);
    expect(pictureWidth(NaN)).toBe(760);
  });
});

describe('completionAsk', () => {
  const text = 'x = 1\ndef f():\n    return \n\nprint(f())\n';
  const at = text.indexOf('return ') + 'return '.length;
  it('sends the code after the cursor as a suffix only to a model that fills holes', () => {
    expect(completionAsk(text, at, true)).toEqual({ prompt: text.slice(0, at), suffix: text.slice(at) });
    expect(completionAsk(text, at, false)).toEqual({ prompt: text.slice(0, at) });
  });
  it('asks nothing with nothing before the cursor, and no suffix with only blanks after it', () => {
    expect(completionAsk('   \n' + text, 2, true)).toBeNull();
    expect(completionAsk('a = 1\n  \n', 6, true)).toEqual({ prompt: 'a = 1\n' });
  });
  it('reads at most 2000 characters before and 1000 after', () => {
    const long = 'a'.repeat(5000) + 'b'.repeat(5000);
    const ask = completionAsk(long, 5000, true)!;
    expect(ask.prompt).toBe('a'.repeat(2000));
    expect(ask.suffix).toBe('b'.repeat(1000));
  });
});

describe('modelLines', () => {
  const one: EngineStatus = { model: 'tiny-llama', ready: true, loading: false };
  it('lists nothing for a server of one model', () => {
    expect(modelLines(one)).toEqual([]);
    expect(modelLines({ ...one, registry: { budget_bytes: 1, used_bytes: 0, models: [
      { name: 'tiny-llama', state: 'loaded', pinned: true, reserved_bytes: 10 }] } })).toEqual([]);
  });
  it('names each model with its state and memory, and counts the others loaded', () => {
    const status: EngineStatus = { ...one, registry: { budget_bytes: 1 << 30, used_bytes: 0, models: [
      { name: 'tiny-llama', state: 'loaded', pinned: true, reserved_bytes: 1536 },
      { name: '/models/qwen', state: 'available', pinned: false, reserved_bytes: null, estimated_bytes: 3 * 2 ** 30 },
      { name: 'gemma', state: 'loaded', pinned: false, reserved_bytes: 2 ** 20 },
      { name: 'broken', state: 'failed', pinned: false, error: 'no config.json' }] } };
    expect(modelLines(status)).toEqual([
      { name: 'tiny-llama', state: 'loaded', detail: 'reserves 1.5 KiB · default' },
      { name: 'qwen', state: 'available', detail: 'about 3.00 GiB' },
      { name: 'gemma', state: 'loaded', detail: 'reserves 1.0 MiB' },
      { name: 'broken', state: 'failed', detail: 'no config.json' }]);
    expect(othersLoaded(status)).toBe(1);
  });
});

describe('jobLines', () => {
  it('lists running jobs with their rows, errors, speed and ETA; finished ones not at all', () => {
    const counts = (total: number, completed: number, failed: number) => ({ total, completed, failed });
    const lines = jobLines([
      { id: 'a', status: 'in_progress', request_counts: counts(2000, 117, 3), progress: { rows_per_s: 14.24, eta_s: 134.2 },
        metadata: { mlx_kind: 'map' } },
      { id: 'b', status: 'cancelling', request_counts: counts(10, 4, 0), progress: null },
      { id: 'c', status: 'completed', request_counts: counts(5, 5, 0) },
      { id: 'd', status: 'validating', request_counts: null }
    ]);
    expect(lines).toEqual([
      { id: 'a', text: 'map · 120/2000 rows · 3 errors · 14.2 rows/s · ETA 134 s', status: 'in_progress' },
      { id: 'b', text: 'batch · 4/10 rows · cancelling', status: 'cancelling' },
      { id: 'd', text: 'batch · 0/0 rows · validating', status: 'validating' }
    ]);
  });
});

describe('interactive', () => {
  it('leaves out the rows of dataset jobs, which their job line stands for', () => {
    const r = (id: string, phase: string, job: string | null) => ({
      id, phase, prompt_tokens: 1, generated_tokens: 0, max_tokens: 8, job });
    const status = { ...base, requests: [r('a', 'decode', null), r('b', 'queued', 'batch_1'), r('c', 'queued', null)] };
    expect(interactive(status).map(x => x.id)).toEqual(['a', 'c']);
    expect(waiting(status)).toBe(1);
  });
});

describe('trainLines', () => {
  it('lists running and queued fine-tunes with their step, losses, speed, ETA and pause, not finished ones', () => {
    const lines = trainLines([
      { id: 'a', status: 'running', mlx_status: 'running', settings: { name: 'orders' }, step: 12, total_steps: 40,
        train_loss: 0.5312, val_loss: 0.61, tokens_per_second: 53.4, eta_s: 30.2, paused: false },
      { id: 'b', status: 'running', mlx_status: 'running', settings: { name: 'polite' }, step: 3, total_steps: 9,
        paused: true },
      { id: 'c', status: 'queued', settings: { name: 'next' } },
      { id: 'd', status: 'succeeded', mlx_status: 'completed', settings: { name: 'done' }, step: 9, total_steps: 9 },
      { id: 'e', status: 'running', mlx_status: 'cancelling', settings: { name: 'stop' } }
    ]);
    expect(lines.map(l => l.text)).toEqual([
      'fine-tune orders · step 12/40 · loss 0.531 · val 0.610 · 53 tok/s · ETA 30 s',
      'fine-tune polite · step 3/9 · paused for a chat',
      'fine-tune next · step 0/? · queued',
      'fine-tune stop · step 0/? · cancelling'
    ]);
    expect(lines.map(l => l.status)).toEqual(['running', 'running', 'queued', 'cancelling']);
  });
});
