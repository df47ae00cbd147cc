"""A process that ends while XLA still runs its sparsile calls exits (integrations/jax/exit_drain.py).

``jax.vmap`` over a stack of layers runs one call per member, one after another; a script that printed
the result's shape (which does not wait for the program) and ended hung forever: the last jax client
was destroyed while Python finalized its modules, joining XLA's threads with the GIL held, while a
handler call on one of them waited for the GIL (the interpreter's partition threads)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from sparsile.tests.support import ROOT

pytest.importorskip("jax")

SCRIPT = textwrap.dedent('''
    import numpy as np, jax, jax.numpy as jnp
    from sparsile.integrations.jax import SparseLinear
    rng = np.random.default_rng(0)
    base = SparseLinear.from_dense(rng.uniform(0.25, 1, (32, 64)).astype(np.float32), "bf16")
    layer = SparseLinear(jnp.stack([base.values] * 3), jnp.stack([base.meta] * 3))
    x = jnp.asarray(rng.uniform(0.25, 1, (3, 5, 64)).astype(np.float32))
    print(jax.vmap(lambda l, x: l(x))(layer, x).shape, flush=True)   # (not waited for)
''')


def test_a_script_ending_while_its_calls_still_run_exits() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "JAX_PLATFORMS": "cpu"}
    try:
        done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120,
                              cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the process did not exit within 120 s (it printed {exc.stdout!r})")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "(3, 5, 32)"


def test_the_drain_waits_for_a_running_call_and_a_quiet_period() -> None:
    from sparsile.integrations.jax.exit_drain import Activity

    activity = Activity()
    activity.wait_quiet(10_000)  # no call ever: at once (it would wait 10000 s)
    activity.enter()
    threading.Timer(0.3, activity.leave).start()
    start = time.monotonic()
    activity.wait_quiet(0.2)  # the call ends at 0.3 s, then 0.2 s of quiet
    assert time.monotonic() - start >= 0.5 - 0.02
