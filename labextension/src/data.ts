// What the panels show, computed from the routes' data. No Lab imports: unit-tested with jest
// (tests/data.test.ts) in a plain DOM.

export interface RequestStatus {
  id: string;
  phase: string;
  prompt_tokens: number;
  generated_tokens: number;
  max_tokens: number;
  source?: string | null;
  label?: string | null;
  tokens_per_s?: number | null;
  job?: string | null; // a dataset job's row: shown as its job's line, not on its own
}

/** One model the server may serve (the `registry` part of the status route). */
export interface RegistryModel {
  name: string;
  state: string; // available, loading, loaded, failed
  pinned: boolean;
  reserved_bytes?: number | null;
  estimated_bytes?: number | null;
  error?: string | null;
}

export interface EngineStatus {
  model: string;
  registry?: { budget_bytes: number; used_bytes: number; models: RegistryModel[] } | null;
  ready: boolean;
  loading: boolean;
  error?: string | null;
  load?: { phase?: string; done?: number; total?: number } | null;
  batch_size?: number;
  tokens_per_s?: number;
  requests?: RequestStatus[];
  fill_in_the_middle?: string | null; // the model's FIM spelling, when it can fill a hole
}

/** A dataset job, as the batches route lists it (the Batch API's batch object and its progress). */
export interface JobStatus {
  id: string;
  status: string;
  request_counts?: { total: number; completed: number; failed: number } | null;
  progress?: { rows_per_s?: number; eta_s?: number | null } | null;
  metadata?: Record<string, string> | null;
}

const RUNNING = ['validating', 'in_progress', 'cancelling'];

/** The jobs still running, one line each: "map · 120/2000 rows · 3 errors · 14.2 rows/s · ETA 134 s". */
export function jobLines(jobs: JobStatus[]): { id: string; text: string; status: string }[] {
  return jobs
    .filter(j => RUNNING.includes(j.status))
    .map(j => {
      const c = j.request_counts ?? { total: 0, completed: 0, failed: 0 };
      const parts = [j.metadata?.mlx_kind ?? 'batch', `${c.completed + c.failed}/${c.total} rows`];
      if (c.failed) {
        parts.push(`${c.failed} errors`);
      }
      const p = j.progress ?? {};
      if (p.rows_per_s) {
        parts.push(`${p.rows_per_s.toFixed(1)} rows/s`);
      }
      if (p.eta_s != null && p.eta_s > 0) {
        parts.push(`ETA ${Math.round(p.eta_s)} s`);
      }
      if (j.status !== 'in_progress') {
        parts.push(j.status);
      }
      return { id: j.id, text: parts.join(' · '), status: j.status };
    });
}

/** A fine-tune, as the fine-tuning jobs route lists it (OpenAI's job object and this server's progress). */
export interface TrainStatus {
  id: string;
  mlx_status?: string; // queued, running, completed, failed, cancelled, cancelling
  status: string;
  settings?: { name?: string; base?: string } | null;
  step?: number;
  total_steps?: number;
  train_loss?: number;
  val_loss?: number;
  tokens_per_second?: number;
  eta_s?: number | null;
  paused?: boolean;
}

const TRAINING = ['queued', 'running', 'cancelling'];

/** The fine-tunes still running, one line each: "fine-tune orders · step 12/40 · loss 0.531 · 53 tok/s · ETA 30 s". */
export function trainLines(jobs: TrainStatus[]): { id: string; text: string; status: string }[] {
  return jobs
    .map(j => ({ j, status: j.mlx_status ?? j.status }))
    .filter(({ status }) => TRAINING.includes(status))
    .map(({ j, status }) => {
      const parts = [`fine-tune ${j.settings?.name ?? j.id}`, `step ${j.step ?? 0}/${j.total_steps ?? '?'}`];
      if (j.train_loss != null) {
        parts.push(`loss ${j.train_loss.toFixed(3)}`);
      }
      if (j.val_loss != null) {
        parts.push(`val ${j.val_loss.toFixed(3)}`);
      }
      if (j.tokens_per_second) {
        parts.push(`${Math.round(j.tokens_per_second)} tok/s`);
      }
      if (j.eta_s != null && j.eta_s > 0) {
        parts.push(`ETA ${Math.round(j.eta_s)} s`);
      }
      if (j.paused) {
        parts.push('paused for a chat');
      } else if (status !== 'running') {
        parts.push(status);
      }
      return { id: j.id, text: parts.join(' · '), status };
    });
}

/** The interactive requests (a dataset job's rows are summed up in its job's line). */
export function interactive(status: EngineStatus): RequestStatus[] {
  return (status.requests ?? []).filter(r => !r.job);
}

/** Interactive requests still waiting for their turn (queued) or for their prompt (prefill). */
export function waiting(status: EngineStatus): number {
  return interactive(status).filter(r => r.phase === 'queued' || r.phase === 'prefill').length;
}

/** "loading 40%", "ready", "error": the engine's state in one word or two. */
export function stateOf(status: EngineStatus): string {
  if (status.error) {
    return 'error';
  }
  if (status.loading) {
    const load = status.load ?? {};
    const done = load.done ?? 0;
    const total = load.total ?? 0;
    return total > 0 ? `loading ${Math.round((100 * done) / total)}%` : 'loading';
  }
  return status.ready ? 'ready' : 'starting';
}

/** An SVG document's root, without anything that could run; null if it is not an SVG. */
export function cleanSvg(text: string): SVGSVGElement | null {
  const doc = new DOMParser().parseFromString(text, 'image/svg+xml');
  const svg = doc.documentElement;
  if (svg.nodeName.toLowerCase() !== 'svg' || doc.querySelector('parsererror')) {
    return null;
  }
  svg.querySelectorAll('script, foreignObject, foreignobject').forEach(el => el.remove());
  for (const el of [svg, ...Array.from(svg.querySelectorAll('*'))]) {
    for (const attr of Array.from(el.attributes)) {
      const value = attr.value.replace(/\s+/g, '').toLowerCase();
      if (attr.name.toLowerCase().startsWith('on') || value.startsWith('javascript:')) {
        el.removeAttribute(attr.name);
      }
    }
  }
  return document.importNode(svg, true) as unknown as SVGSVGElement;
}

/** "1.5 GiB", "640 KiB": bytes as the magics print them. */
export function humanBytes(n: number | null | undefined): string {
  let value = n ?? 0;
  for (const unit of ['B', 'KiB', 'MiB']) {
    if (value < 1024) {
      return unit === 'B' ? `${Math.round(value)} B` : `${value.toFixed(1)} ${unit}`;
    }
    value /= 1024;
  }
  return `${value.toFixed(2)} GiB`;
}

/** The server's models, one line each (name, state, what it reserves of the memory budget: weights and
 * prefix-cache budget, or an estimate before it loads), when it serves more than one; else none. */
export function modelLines(status: EngineStatus): { name: string; state: string; detail: string }[] {
  const models = status.registry?.models ?? [];
  if (models.length < 2) {
    return [];
  }
  return models.map(m => {
    const held =
      m.reserved_bytes != null ? `reserves ${humanBytes(m.reserved_bytes)}` : `about ${humanBytes(m.estimated_bytes)}`;
    const detail = m.state === 'failed' ? (m.error ?? 'failed') : held + (m.pinned ? ' · default' : '');
    return { name: shortName(m.name), state: m.state, detail };
  });
}

/** How many models besides the default one are loaded (the status bar says "+N"). */
export function othersLoaded(status: EngineStatus): number {
  return (status.registry?.models ?? []).filter(m => !m.pinned && m.state === 'loaded').length;
}

/** A model served from a folder is named by the folder, not its whole path. */
export function shortName(model: string): string {
  return model.replace(/\/+$/, '').split('/').pop() || model;
}

/** The width to draw a picture for a panel `px` wide: the server's range (160..2000 px), and its
 * usual 760 px while the panel is hidden (0 px wide). */
export function pictureWidth(px: number): number {
  if (!Number.isFinite(px) || px <= 0) {
    return 760;
  }
  return Math.min(2000, Math.max(160, Math.floor(px)));
}

export const BEFORE_CHARS = 2000; // the code before the cursor the model reads
export const AFTER_CHARS = 1000; // and after it, for a model that fills holes

/** What to ask for at `offset` in `text`: the code before the cursor, and the code after it as a
 * suffix when the model fills holes (fill-in-the-middle) and there is any; null with nothing before. */
export function completionAsk(
  text: string,
  offset: number,
  fillsHoles: boolean
): { prompt: string; suffix?: string } | null {
  const prompt = text.slice(Math.max(0, offset - BEFORE_CHARS), offset);
  if (!prompt.trim()) {
    return null;
  }
  const after = fillsHoles ? text.slice(offset, offset + AFTER_CHARS) : '';
  return after.trim() ? { prompt, suffix: after } : { prompt };
}
