// The sidebar's chat box as a Lumino widget: its DOM is its node, its answer length is the
// setting's, and disposing it stops an answer still streaming (the route is mocked: no server).
import { Widget } from '@lumino/widgets';

import { streamChat } from '../src/api';
import { ChatBox } from '../src/chat';

jest.mock('../src/api', () => ({ streamChat: jest.fn() }));

const streamed = streamChat as jest.MockedFunction<typeof streamChat>;

/** A stream that sends nothing until it is aborted, as a long answer still coming does. */
function endless(): void {
  streamed.mockImplementation(
    (_messages, _maxTokens, _onText, signal) =>
      new Promise((_resolve, reject) => signal.addEventListener('abort', () => reject(new Error('aborted'))))
  );
}

function ask(box: ChatBox, question: string): Promise<void> {
  box.node.querySelector<HTMLTextAreaElement>('.mlx-nb-Chat-input')!.value = question;
  return box.ask();
}

afterEach(() => streamed.mockReset());

describe('ChatBox', () => {
  it('is a widget whose node holds the chat', () => {
    const box = new ChatBox(null);
    Widget.attach(box, document.body);
    expect(box.node.classList).toContain('mlx-nb-Chat');
    expect(box.node.querySelector('.mlx-nb-Chat-input')).not.toBeNull();
    expect(document.body.contains(box.node)).toBe(true);
    box.dispose();
    expect(document.body.contains(box.node)).toBe(false);
  });

  it('asks for the answer length it is given', async () => {
    streamed.mockResolvedValue('stop');
    const box = new ChatBox(null);
    box.maxTokens = 64;
    await ask(box, 'hello');
    expect(streamed.mock.calls[0][1]).toBe(64);
    expect(box.node.querySelector('.mlx-nb-Chat-assistant')!.getAttribute('data-finish')).toBe('stop');
  });

  it('stops the answer still streaming when it is disposed', async () => {
    endless();
    const box = new ChatBox(null);
    Widget.attach(box, document.body);
    const answering = ask(box, 'tell me a long story');
    const signal = streamed.mock.calls[0][3];
    expect(signal.aborted).toBe(false);
    box.dispose();
    expect(signal.aborted).toBe(true);
    await answering; // it ends, and writes nothing more into the box that is gone
    expect(box.node.querySelector('.mlx-nb-Chat-assistant')!.hasAttribute('data-finish')).toBe(false);
  });
});
