// The status bar item and the "MLX" sidebar. Text reaches the page through textContent only:
// request labels and sources come from other notebooks and clients, so nothing is parsed as HTML.
import { Panel, Widget } from '@lumino/widgets';

import { abortRequest, cancelJob, cancelTraining } from './api';
import {
  EngineStatus,
  interactive,
  jobLines,
  JobStatus,
  modelLines,
  othersLoaded,
  RequestStatus,
  shortName,
  stateOf,
  trainLines,
  TrainStatus,
  waiting
} from './data';

/** One line: model · state · batch · queue · tokens/s. Clicking it runs `onClick`. */
export class StatusItem extends Widget {
  constructor(onClick: () => void) {
    super();
    this.addClass('mlx-nb-StatusItem');
    this.node.title = 'MLX engine: open the sidebar';
    this.node.addEventListener('click', onClick);
    this.node.textContent = 'MLX …';
  }

  show_(status: EngineStatus | null, error?: string): void {
    if (status === null) {
      this.node.textContent = `MLX · ${error ?? 'unreachable'}`;
      this.node.dataset.state = 'error';
      return;
    }
    const state = stateOf(status);
    const others = othersLoaded(status);
    const parts = [`MLX · ${shortName(status.model)}${others ? ` (+${others})` : ''} · ${state}`];
    if (status.ready) {
      parts.push(`batch ${status.batch_size ?? 0}`, `queue ${waiting(status)}`);
      parts.push(`${(status.tokens_per_s ?? 0).toFixed(1)} tok/s`);
    }
    this.node.textContent = parts.join(' · ');
    this.node.dataset.state = state.split(' ')[0];
    this.node.dataset.batch = String(status.batch_size ?? 0);
  }
}

/**
 * The live requests of every notebook and client, each with an Abort button, and the selected
 * one's cache; below them the parts added (the chat box), then the batch timeline. A panel of
 * widgets, so a part is a child widget: it gets Lumino's messages and is disposed with the sidebar.
 */
export class Sidebar extends Panel {
  private requests = new Widget();
  private models = document.createElement('ul');
  private header = document.createElement('div');
  private list = document.createElement('ul');
  private jobs = document.createElement('ul');
  private cache = document.createElement('div');
  private timeline = new Widget();
  /** The request whose cache is shown (a row was clicked), while it is live. */
  selected: string | null = null;

  constructor() {
    super();
    this.id = 'mlx-nb-sidebar';
    this.addClass('mlx-nb-Sidebar');
    this.title.label = 'MLX';
    this.title.caption = 'The shared MLX engine';
    this.header.className = 'mlx-nb-Sidebar-header';
    this.list.className = 'mlx-nb-Sidebar-requests';
    this.jobs.className = 'mlx-nb-Sidebar-jobs';
    this.cache.className = 'mlx-nb-Sidebar-cache';
    this.requests.addClass('mlx-nb-Sidebar-live');
    this.models.className = 'mlx-nb-Sidebar-models';
    this.requests.node.append(this.models, this.header, this.jobs, this.list, this.cache);
    this.timeline.addClass('mlx-nb-Sidebar-timeline');
    this.addWidget(this.requests);
    this.addWidget(this.timeline);
  }

  /** A part between the requests and the timeline (the chat box). */
  addPart(part: Widget): void {
    this.insertWidget(this.widgets.indexOf(this.timeline), part);
  }

  /** The selected request's cache (rows x positions per layer type), or nothing once it ended. */
  showCache(picture: SVGSVGElement | null): void {
    if (picture === null) {
      this.selected = null;
      this.cache.replaceChildren();
    } else {
      this.cache.replaceChildren(picture);
    }
  }

  /** The width the pictures have to fill (they are drawn for it, so text keeps its size). */
  get pictureWidth(): number {
    return this.timeline.node.clientWidth;
  }

  /** The dataset jobs and fine-tunes running on the server, each with a Stop button (a job's rows are
   * background rows of the batch, so they are not listed among the requests one by one). */
  showJobs(jobs: JobStatus[], trainings: TrainStatus[] = []): void {
    type Line = { id: string; text: string; status: string };
    const line = (j: Line, what: string, cancel: (id: string) => Promise<boolean>) => {
      const stop = document.createElement('button');
      stop.className = 'jp-Button mlx-nb-Button mlx-nb-Job-stop';
      stop.textContent = 'Stop';
      stop.title = `Stop ${what} ${j.id}`;
      stop.disabled = j.status === 'cancelling';
      stop.addEventListener('click', () => {
        stop.disabled = true;
        void cancel(j.id);
      });
      return item('mlx-nb-Job', { id: j.id, status: j.status }, span('mlx-nb-Job-progress', j.text), stop);
    };
    this.jobs.replaceChildren(
      ...jobLines(jobs).map(j => line(j, 'job', cancelJob)),
      ...trainLines(trainings).map(j => line(j, 'fine-tune', cancelTraining))
    );
  }

  /** The batch timeline (every request of every notebook and client, joining and leaving). */
  showTimeline(picture: SVGSVGElement | null): void {
    if (picture !== null) {
      this.timeline.node.replaceChildren(picture);
    }
  }

  show_(status: EngineStatus | null, error?: string): void {
    if (status === null) {
      this.header.textContent = `The engine cannot be reached: ${error ?? 'no answer'}`;
      this.list.replaceChildren();
      return;
    }
    this.models.replaceChildren(
      ...modelLines(status).map(m =>
        item(
          'mlx-nb-Model',
          { state: m.state, name: m.name },
          span('mlx-nb-Model-name', m.name),
          span('mlx-nb-Model-state', `${m.state} · ${m.detail}`)
        )
      )
    );
    const requests = interactive(status);
    this.header.textContent =
      `${shortName(status.model)} · ${stateOf(status)} · batch ${status.batch_size ?? 0} · ` +
      `queue ${waiting(status)} · ${requests.length} running`;
    this.list.replaceChildren(...requests.map(r => this.row(r)));
  }

  private row(r: RequestStatus): HTMLElement {
    const li = document.createElement('li');
    li.className = 'mlx-nb-Request' + (r.id === this.selected ? ' mlx-nb-mod-selected' : '');
    li.dataset.id = r.id;
    li.dataset.phase = r.phase;
    li.title = 'Click to show this request\'s cache';
    li.addEventListener('click', () => {
      this.selected = r.id;
      this.list.querySelectorAll('.mlx-nb-Request').forEach(el => el.classList.remove('mlx-nb-mod-selected'));
      li.classList.add('mlx-nb-mod-selected');
    });
    const who = document.createElement('div');
    who.className = 'mlx-nb-Request-source';
    who.textContent = r.source || 'unknown source';
    const what = document.createElement('div');
    what.className = 'mlx-nb-Request-label';
    what.textContent = r.label || r.id;
    const progress = document.createElement('div');
    progress.className = 'mlx-nb-Request-progress';
    progress.textContent = `${r.phase} · ${r.generated_tokens}/${r.max_tokens} tokens`;
    const abort = document.createElement('button');
    abort.className = 'jp-Button mlx-nb-Button mlx-nb-Request-abort';
    abort.textContent = 'Abort';
    abort.title = `Abort request ${r.id}`;
    abort.addEventListener('click', event => {
      event.stopPropagation(); // aborting is not selecting
      abort.disabled = true;
      void abortRequest(r.id);
    });
    li.append(who, what, progress, abort);
    return li;
  }
}

/** A list item of class `className` with `data` attributes, holding `children`. */
function item(className: string, data: Record<string, string>, ...children: HTMLElement[]): HTMLLIElement {
  const li = document.createElement('li');
  li.className = className;
  Object.assign(li.dataset, data);
  li.append(...children);
  return li;
}

/** A span of plain text (never parsed as HTML: it may come from another client). */
function span(className: string, text: string): HTMLSpanElement {
  const el = document.createElement('span');
  el.className = className;
  el.textContent = text;
  return el;
}
