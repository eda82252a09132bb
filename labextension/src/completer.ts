// Inline completions (ghost text) in code cells and files from the shared engine, through
// JupyterLab's inline completer: the code before the cursor is continued by the completions route
// (sent as source "completer", so it shows in the batch view). A model whose tokenizer has
// fill-in-the-middle tokens (the engine's status says so) also reads the code after the cursor and
// fills the hole. A request still running when the user types on is aborted: closing its
// connection ends it on the server.
import {
  CompletionHandler,
  IInlineCompletionContext,
  IInlineCompletionItem,
  IInlineCompletionList,
  IInlineCompletionProvider
} from '@jupyterlab/completer';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { JSONValue } from '@lumino/coreutils';

import { complete } from './api';
import { completionAsk } from './data';

export class EngineCompletions implements IInlineCompletionProvider {
  readonly identifier = 'mlx-nb:inline';
  readonly name = 'MLX shared engine';
  readonly schema: ISettingRegistry.IProperty = {
    type: 'object',
    properties: {
      maxTokens: {
        title: 'Completion length',
        description: 'Most tokens the engine writes for one suggestion.',
        type: 'number',
        minimum: 1,
        maximum: 512,
        default: 48
      }
    },
    default: { maxTokens: 48 }
  };
  private maxTokens = 48;
  private running: AbortController | null = null;

  /** `fillsHoles`: whether the served model reads the code after the cursor too. */
  constructor(private fillsHoles: () => boolean) {}

  configure(settings: { [property: string]: JSONValue }): void {
    const value = settings.maxTokens;
    if (typeof value === 'number' && value >= 1) {
      this.maxTokens = Math.min(512, Math.floor(value));
    }
  }

  async fetch(
    request: CompletionHandler.IRequest,
    context: IInlineCompletionContext
  ): Promise<IInlineCompletionList<IInlineCompletionItem>> {
    this.running?.abort(); // typed on: the last suggestion is not wanted any more
    const running = new AbortController();
    this.running = running;
    const ask = completionAsk(request.text, request.offset, this.fillsHoles());
    if (ask === null) {
      return { items: [] };
    }
    try {
      const text = await complete(ask, this.maxTokens, running.signal);
      return { items: text ? [{ insertText: text }] : [] };
    } catch {
      return { items: [] }; // aborted, or the engine is not ready: no suggestion
    } finally {
      if (this.running === running) {
        this.running = null;
      }
    }
  }
}
