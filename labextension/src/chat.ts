// The sidebar's chat box: a conversation with the shared engine, streamed, with Stop; images go
// with the next question by pasting or dropping them on the box (for a vision model; a text model
// answers with the route's one-line error). The answer is model output, so it is rendered as
// untrusted Markdown (JupyterLab's sanitizer drops any HTML that could run), or as plain text
// where no renderer is available. A Lumino widget: the sidebar holds it as a child, and disposing
// it (with the sidebar) stops an answer still streaming.
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { Widget } from '@lumino/widgets';

import { ChatMessage, ContentPart, streamChat } from './api';
import { DEFAULT_SETTINGS } from './settings';

const RENDER_MS = 100; // the answer is re-rendered at most this often while it streams

export class ChatBox extends Widget {
  private _maxTokens = DEFAULT_SETTINGS.chatMaxTokens;

  /** Most tokens asked for in one answer (the chatMaxTokens setting), shown as `data-max-tokens`. */
  get maxTokens(): number {
    return this._maxTokens;
  }

  set maxTokens(value: number) {
    this._maxTokens = value;
    this.node.dataset.maxTokens = String(value);
  }
  private log = document.createElement('div');
  private input = document.createElement('textarea');
  private send = document.createElement('button');
  private stop = document.createElement('button');
  private history: ChatMessage[] = [];
  private running: AbortController | null = null;
  private images: string[] = []; // data: URLs waiting for the next question
  private attached = document.createElement('div');

  constructor(private rendermime: IRenderMimeRegistry | null) {
    super();
    this.addClass('mlx-nb-Chat');
    this.node.dataset.maxTokens = String(this._maxTokens);
    this.log.className = 'mlx-nb-Chat-log';
    this.input.className = 'mlx-nb-Chat-input';
    this.input.placeholder = 'Ask the model (Enter sends, Shift+Enter for a new line)';
    this.input.rows = 3;
    this.send.className = 'jp-Button mlx-nb-Button mlx-nb-Chat-send';
    this.send.textContent = 'Send';
    this.stop.className = 'jp-Button mlx-nb-Button mlx-nb-Chat-stop';
    this.stop.textContent = 'Stop';
    this.stop.disabled = true;
    const buttons = document.createElement('div');
    buttons.className = 'mlx-nb-Chat-buttons';
    buttons.append(this.send, this.stop);
    this.attached.className = 'mlx-nb-Chat-attached';
    this.node.append(this.log, this.attached, this.input, buttons);
    this.input.addEventListener('paste', event => this.take(event.clipboardData?.files, event));
    this.input.addEventListener('dragover', event => event.preventDefault());
    this.input.addEventListener('drop', event => this.take(event.dataTransfer?.files, event));
    this.send.addEventListener('click', () => void this.ask());
    this.stop.addEventListener('click', () => this.running?.abort());
    this.input.addEventListener('keydown', event => {
      if (event.key === 'Enter' && !event.shiftKey) {
        event.preventDefault();
        void this.ask();
      }
    });
  }

  /** Stops the answer still streaming, if any: closing its stream aborts the request on the server. */
  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this.running?.abort();
    super.dispose();
  }

  /** Images pasted or dropped: read as data: URLs, shown as thumbnails until the question goes. */
  private take(files: FileList | undefined | null, event: Event): void {
    const images = Array.from(files ?? []).filter(f => f.type.startsWith('image/'));
    if (!images.length) {
      return;
    }
    event.preventDefault();
    for (const file of images) {
      const reader = new FileReader();
      reader.onload = () => {
        const url = String(reader.result);
        this.images.push(url);
        const thumb = document.createElement('img');
        thumb.className = 'mlx-nb-Chat-thumb';
        thumb.alt = file.name;
        thumb.src = url;
        this.attached.append(thumb);
      };
      reader.readAsDataURL(file);
    }
  }

  private turn(role: string, text: string): HTMLElement {
    const el = document.createElement('div');
    el.className = `mlx-nb-Chat-turn mlx-nb-Chat-${role}`;
    el.textContent = text;
    this.log.append(el);
    return el;
  }

  private async render(el: HTMLElement, text: string): Promise<void> {
    if (this.rendermime === null) {
      el.textContent = text;
      return;
    }
    const model = this.rendermime.createModel({ data: { 'text/markdown': text }, trusted: false });
    const renderer = this.rendermime.createRenderer('text/markdown');
    await renderer.renderModel(model);
    el.replaceChildren(renderer.node);
  }

  async ask(): Promise<void> {
    const question = this.input.value.trim();
    if (!question || this.running !== null) {
      return;
    }
    this.input.value = '';
    const asked = this.turn('user', question);
    const answer = this.turn('assistant', '…');
    const parts: ContentPart[] = this.images.map(url => ({ type: 'image_url', image_url: { url } }));
    if (parts.length) {
      asked.append(...Array.from(this.attached.children)); // the thumbnails go with their question
      asked.dataset.images = String(parts.length);
    }
    this.images = [];
    // earlier turns keep their text only: images are sent once, with their own question
    const earlier = this.history.map(m => ({ ...m, content: textOf(m.content) }));
    this.history.push({ role: 'user', content: question });
    const messages: ChatMessage[] = [
      ...earlier,
      { role: 'user', content: parts.length ? [...parts, { type: 'text', text: question }] : question }
    ];
    this.running = new AbortController();
    this.send.disabled = true;
    this.stop.disabled = false;
    let text = '';
    let shown = 0;
    let reason: string | null = null;
    const thinking = new Thinking(answer);
    const body = document.createElement('div');
    answer.replaceChildren(body);
    body.textContent = '…';
    try {
      reason = await streamChat(
        messages,
        this.maxTokens,
        piece => {
          text += piece;
          thinking.answered();
          if (Date.now() - shown > RENDER_MS) {
            shown = Date.now();
            void this.render(body, text);
          }
        },
        this.running.signal,
        piece => thinking.add(piece)
      );
    } catch (err) {
      reason = this.running.signal.aborted ? 'stopped' : `error: ${(err as Error).message}`;
    }
    if (this.isDisposed) {
      return; // the box is gone (its dispose stopped the stream): nothing shows the answer now
    }
    thinking.answered();
    await this.render(body, text);
    answer.dataset.finish = reason ?? 'stop';
    const footer = document.createElement('div');
    footer.className = 'mlx-nb-Chat-footer';
    footer.textContent =
      reason === 'stopped' ? 'stopped' : reason === 'length' ? 'stopped at max tokens' : reason?.startsWith('error') ? reason : '';
    answer.append(footer);
    this.history.push({ role: 'assistant', content: text });
    this.running = null;
    this.send.disabled = false;
    this.stop.disabled = true;
  }
}

/**
 * A thinking model's reasoning, shown above the answer as a collapsible "Thinking" part: open
 * while the reasoning streams, closed once the answer starts (a click opens it again). Shown as
 * plain text: it is model output, and nothing in it is rendered.
 */
class Thinking {
  private details: HTMLDetailsElement | null = null;
  private text = document.createElement('div');
  private closed = false;

  constructor(private answer: HTMLElement) {}

  add(piece: string): void {
    if (this.details === null) {
      this.details = document.createElement('details');
      this.details.className = 'mlx-nb-Chat-thinking';
      this.details.open = true;
      const summary = document.createElement('summary');
      summary.textContent = 'Thinking';
      this.text.className = 'mlx-nb-Chat-thinking-text';
      this.details.append(summary, this.text);
      this.answer.prepend(this.details);
    }
    this.text.textContent += piece;
  }

  /** The answer has started (or the reply ended): fold the reasoning away, once. */
  answered(): void {
    if (this.details !== null && !this.closed) {
      this.closed = true;
      this.details.open = false;
    }
  }
}

function textOf(content: string | ContentPart[]): string {
  return typeof content === 'string' ? content : content.map(p => (p.type === 'text' ? p.text : '')).join('');
}
