"""Queue requests while the engine thread is busy, so they all reach it at the same step.

Which requests share a batch is the scheduler's choice, made step by step as submits arrive: on a
busy machine two submits a few microseconds apart can land in different steps. A test about what
rows do *together* holds the engine thread inside `held(...)`, submits, and lets go: the loop takes
every queued command before it steps, so all of them are admitted at once (up to max_batch).
"""

import threading
from contextlib import contextmanager


@contextmanager
def held(engine, timeout: float = 120.0):
    inside, release = threading.Event(), threading.Event()

    def hold():
        inside.set()
        release.wait(timeout)

    t = threading.Thread(target=engine._call, args=(hold,), kwargs={"timeout": timeout}, daemon=True)
    t.start()
    if not inside.wait(timeout):
        raise TimeoutError("the engine thread never took the hold")
    try:
        yield
    finally:
        release.set()
        t.join(timeout)
