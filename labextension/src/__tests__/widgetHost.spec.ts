/**
 * bindWidget(): the notebook widgets' redraw is deferred to an animation
 * frame; an output removed before that frame must not be drawn into.
 *
 * Jest runs in Node: the browser's frame loop, MutationObserver and <body>
 * are given here as the least that bindWidget() touches, the frames run
 * when the test says so.
 */
import { IWidgetModel, IWidgetView, bindWidget } from '../charts/widgetHost';

type Frame = () => void;

const g = globalThis as unknown as Record<string, unknown>;
let frames: Map<number, Frame>;
let lastFrame: number;

/** Run the frames requested so far, as the browser's next frame would. */
function nextFrame(): void {
  const due = [...frames.values()];
  frames.clear();
  due.forEach(f => f());
}

beforeEach(() => {
  frames = new Map();
  lastFrame = 0;
  g.requestAnimationFrame = (f: Frame): number => {
    frames.set(++lastFrame, f);
    return lastFrame;
  };
  g.cancelAnimationFrame = (id: number): void => {
    frames.delete(id);
  };
  g.MutationObserver = class {
    observe(): void {}
    disconnect(): void {}
  };
  g.document = { body: { getAttribute: () => null } };
});

afterEach(() => {
  for (const name of ['requestAnimationFrame', 'cancelAnimationFrame', 'MutationObserver', 'document']) {
    delete g[name];
  }
});

/** A model holding its traits, with anywidget's change events. */
class Model implements IWidgetModel {
  private readonly traits = new Map<string, unknown>();
  private readonly handlers = new Map<string, Set<() => void>>();

  constructor(traits: { [name: string]: unknown }) {
    Object.entries(traits).forEach(([k, v]) => this.traits.set(k, v));
  }

  get(name: string): unknown {
    return this.traits.get(name);
  }

  set(name: string, value: unknown): void {
    this.traits.set(name, value);
    this.handlers.get(`change:${name}`)?.forEach(h => h());
  }

  save_changes(): void {}

  on(event: string, callback: () => void): void {
    if (!this.handlers.has(event)) {
      this.handlers.set(event, new Set());
    }
    this.handlers.get(event)!.add(callback);
  }

  off(event: string, callback: () => void): void {
    this.handlers.get(event)?.delete(callback);
  }
}

/** A view that records its draws and refuses to draw once disposed (as a disposed chart would fail). */
function view(): IWidgetView<object> & { drawn: unknown[]; disposed: boolean } {
  const v = {
    drawn: [] as unknown[],
    disposed: false,
    draw(data: unknown): void {
      if (v.disposed) {
        throw new Error('drawn after dispose');
      }
      v.drawn.push(data);
    },
    setDark(): void {},
    setState(): void {},
    listen(): void {},
    dispose(): void {
      v.disposed = true;
    }
  };
  return v;
}

describe('bindWidget', () => {
  it('draws several changes within one frame once, with the latest data', () => {
    const model = new Model({ data: 1 });
    const v = view();
    bindWidget(model, v);
    model.set('data', 2);
    model.set('data', 3);
    nextFrame();
    expect(v.drawn).toEqual([3]);
    model.set('data', 4);
    nextFrame();
    expect(v.drawn).toEqual([3, 4]);
  });

  it('does not draw into a view disposed between a change and its frame', () => {
    const model = new Model({ data: 1 });
    const v = view();
    const cleanUp = bindWidget(model, v);
    nextFrame();
    model.set('data', 2); // a redraw is pending
    cleanUp();
    expect(() => nextFrame()).not.toThrow();
    expect(v.drawn).toEqual([1]);
    expect(frames.size).toBe(0);
  });

  it('does not draw a view removed before its first frame', () => {
    const model = new Model({ data: 1 });
    const v = view();
    bindWidget(model, v)();
    expect(() => nextFrame()).not.toThrow();
    expect(v.drawn).toEqual([]);
  });
});
