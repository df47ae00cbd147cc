"""Let the Python handler's calls finish before the interpreter finalizes (an ``atexit`` drain).

XLA runs a program asynchronously: ``print(layer(x).shape)`` at the end of a script returns before
the program ran, and the process then exits while XLA's threads still call ``sparsile_call``. The
Python handler (integrations/jax/ffi.py) holds the GIL while it runs, and the CPU path runs the
interpreter, whose partition threads wait on each other. Once Python finalizes its modules, the last
jax client is destroyed with the GIL held and joins XLA's threads, while a handler running on one
of them needs the GIL (or waits on a partition thread that does): the process never exits (seen
with ``jax.vmap`` over a stack of layers, whose calls run one after another; the script printed its
result and hung).

While ``atexit`` handlers run, other threads can still take the GIL. So this module's handler, run
before jax's own (``atexit`` runs the last registered first, and this module is imported after
jax), waits until no handler call is running and none has ended for :data:`QUIET_S` seconds (the
calls of one program come back to back), then blocks on every live jax array (the programs whose
results are still referenced). A process that made no call since :data:`QUIET_S` seconds exits at
once. A program whose calls are separated by more than :data:`QUIET_S` seconds of other work, and
whose results nothing references, can still be cut short by the exit.
"""

from __future__ import annotations

import atexit
import threading
import time

import jax  # (first: jax registers its atexit handlers on import, so this module's runs before them)

QUIET_S = 0.25
"""Seconds without a handler call after which the programs using the handler are taken as done."""


class Activity:
    """Handler calls running now, and when the last one ended (``time.monotonic``)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.running = 0
        self.last_end = float("-inf")

    def enter(self) -> None:
        with self.cond:
            self.running += 1

    def leave(self) -> None:
        with self.cond:
            self.running -= 1
            self.last_end = time.monotonic()
            self.cond.notify_all()

    def wait_quiet(self, quiet_s: float = QUIET_S) -> None:
        """Return once no call runs and none ended in the last ``quiet_s`` seconds."""
        with self.cond:
            while True:
                if self.running:
                    self.cond.wait(quiet_s)
                    continue
                idle = time.monotonic() - self.last_end
                if idle >= quiet_s:
                    return
                self.cond.wait(quiet_s - idle)


ACTIVITY = Activity()


def drain() -> None:
    """The ``atexit`` handler: wait for the handler's calls to go quiet, then for the live arrays."""
    ACTIVITY.wait_quiet()
    try:
        for array in jax.live_arrays():
            array.block_until_ready()
    except Exception:  # (an array deleted meanwhile, a backend gone, a failed program: nothing to wait for)
        pass
    ACTIVITY.wait_quiet()


atexit.register(drain)
