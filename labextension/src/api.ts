// The engine's routes as the Lab reaches them: with the user's Jupyter session (ServerConnection
// sends its cookie and XSRF token), so no API key is pasted anywhere.
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { cleanSvg, EngineStatus, JobStatus, pictureWidth, TrainStatus } from './data';

const settings = ServerConnection.makeSettings();

function url(path: string): string {
  return URLExt.join(settings.baseUrl, 'mlx', 'v1', path);
}

export async function fetchStatus(): Promise<EngineStatus> {
  const response = await ServerConnection.makeRequest(url('status'), {}, settings);
  if (!response.ok) {
    throw new Error(`status ${response.status}`);
  }
  return (await response.json()) as EngineStatus;
}

/** Abort a live request; false if it had already finished. */
export async function abortRequest(id: string): Promise<boolean> {
  const response = await ServerConnection.makeRequest(
    url(`requests/${encodeURIComponent(id)}`),
    { method: 'DELETE' },
    settings
  );
  return response.ok;
}

/**
 * The batch timeline the notebook widget draws, drawn by the server from the same events. It is
 * inserted inline (so it takes the theme's colours), after removing anything that could run:
 * scripts, foreign objects, event handler attributes and script URLs.
 */
export async function fetchBatchPicture(lanes: number, width: number): Promise<SVGSVGElement | null> {
  const response = await ServerConnection.makeRequest(
    url(`batch.svg?lanes=${lanes}&width=${pictureWidth(width)}`),
    {},
    settings
  );
  return response.ok ? cleanSvg(await response.text()) : null;
}

/** A live request's cache as the CacheInspector widget draws it; null once it has ended. */
export async function fetchCachePicture(id: string, width: number): Promise<SVGSVGElement | null> {
  const response = await ServerConnection.makeRequest(
    url(`cache.svg?request_id=${encodeURIComponent(id)}&width=${pictureWidth(width)}`),
    {},
    settings
  );
  return response.ok ? cleanSvg(await response.text()) : null;
}

/** The server's jobs (newest first), as the Batch API lists them. */
export async function fetchJobs(): Promise<JobStatus[]> {
  const response = await ServerConnection.makeRequest(url('batches?limit=20'), {}, settings);
  return response.ok ? ((await response.json()).data as JobStatus[]) : [];
}

/** The server's fine-tunes (newest first), as the fine-tuning jobs route lists them. */
export async function fetchTrainings(): Promise<TrainStatus[]> {
  const response = await ServerConnection.makeRequest(url('fine_tuning/jobs?limit=20'), {}, settings);
  return response.ok ? ((await response.json()).data as TrainStatus[]) : [];
}

/** Stop a fine-tune: its checkpoints so far stay served. */
export async function cancelTraining(id: string): Promise<boolean> {
  const response = await ServerConnection.makeRequest(
    url(`fine_tuning/jobs/${encodeURIComponent(id)}/cancel`),
    { method: 'POST' },
    settings
  );
  return response.ok;
}

/** Stop a job: its rows in flight are aborted, the rows it finished are kept. */
export async function cancelJob(id: string): Promise<boolean> {
  const response = await ServerConnection.makeRequest(
    url(`batches/${encodeURIComponent(id)}/cancel`),
    { method: 'POST' },
    settings
  );
  return response.ok;
}

/** Empty the engine's prefix cache; what it held ({entries, bytes, ...}). */
export async function clearPrefixCache(): Promise<{ entries: number; bytes: number }> {
  const response = await ServerConnection.makeRequest(url('cache'), { method: 'DELETE' }, settings);
  if (!response.ok) {
    throw new Error(`clearing the prefix cache failed: ${response.status}`);
  }
  return await response.json();
}

export type ContentPart = { type: 'text'; text: string } | { type: 'image_url'; image_url: { url: string } };

export interface ChatMessage {
  role: 'user' | 'assistant';
  content: string | ContentPart[];
}

/**
 * A streamed chat through the chat completions route, at most `maxTokens` long: `onText` gets
 * each piece of the answer as it comes, `onReasoning` each piece of a thinking model's reasoning
 * (it streams first, as `delta.reasoning_content`). Aborting `signal` closes the stream, which
 * aborts the request on the server.
 */
export async function streamChat(
  messages: ChatMessage[],
  maxTokens: number,
  onText: (piece: string) => void,
  signal: AbortSignal,
  onReasoning: (piece: string) => void = () => undefined
): Promise<string | null> {
  const init: RequestInit = {
    method: 'POST',
    body: JSON.stringify({ messages, stream: true, max_tokens: maxTokens }),
    headers: { 'Content-Type': 'application/json', 'X-MLX-Source': 'Lab sidebar chat' },
    signal
  };
  const response = await ServerConnection.makeRequest(url('chat/completions'), init, settings);
  if (!response.ok || response.body === null) {
    const body = await response.json().catch(() => ({}));
    throw new Error(body?.error?.message ?? `the chat failed: ${response.status}`);
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  let finish: string | null = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) {
      break;
    }
    buffer += decoder.decode(value, { stream: true });
    let end: number;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split('\n')) {
        if (!line.startsWith('data: {')) {
          continue;
        }
        const chunk = JSON.parse(line.slice(6));
        if (chunk.error) {
          throw new Error(chunk.error.message ?? 'generation failed'); // an engine error mid-stream
        }
        for (const choice of chunk.choices ?? []) {
          if (choice.delta?.reasoning_content) {
            onReasoning(choice.delta.reasoning_content);
          }
          if (choice.delta?.content) {
            onText(choice.delta.content);
          }
          finish = choice.finish_reason ?? finish;
        }
      }
    }
  }
  return finish;
}

/** A continuation of `prompt` (greedy, at most `maxTokens`), for inline completions. */
export async function complete(
  ask: { prompt: string; suffix?: string },
  maxTokens: number,
  signal: AbortSignal
): Promise<string> {
  const init: RequestInit = {
    method: 'POST',
    body: JSON.stringify({ ...ask, max_tokens: maxTokens, temperature: 0, stop: ['\n\n\n'] }),
    headers: { 'Content-Type': 'application/json', 'X-MLX-Source': 'completer' },
    signal
  };
  const response = await ServerConnection.makeRequest(url('completions'), init, settings);
  if (!response.ok) {
    throw new Error(`completions ${response.status}`);
  }
  const body = await response.json();
  return body.choices?.[0]?.text ?? '';
}
