"""Shared pytest configuration: the ``gpu`` marker skips cleanly on machines without an NVIDIA GPU,
the number of pytest-xdist workers, and the hypothesis profiles.

Workers: pyproject's addopts run ``-n auto --dist loadfile`` (each test file in one worker process,
so a file's cached compiles are built once): one worker per core on a machine without a GPU, one
worker where there is a GPU, so that GPU tests never share the device. ``-n 0`` runs everything
in the pytest process itself; ``-n 4`` asks for four workers anyway.

Hypothesis profiles: ``dev`` (the default) draws random examples but never reads or writes the
``.hypothesis/`` example database, so a failure found once is not replayed forever from the
checkout (rerun it with the ``--hypothesis-seed`` the report prints), and hypothesis's caches live
in a temporary folder; ``ci`` (selected when the
environment variable ``CI`` is set, as ``.ci/run`` does) is derandomized: the same examples every
run. ``HYPOTHESIS_PROFILE=dev|ci`` picks one explicitly.

JAX in the test processes allocates GPU memory as it needs it (``XLA_PYTHON_CLIENT_PREALLOCATE``),
not 75 % of the card at once: GPU test workers share the device.

Global random generators (numpy's legacy ``np.random.*``, torch's default generator when torch is
loaded) are seeded before every test, so a test that draws from them without its own seed still
sees the same numbers on every run, in any order and in any worker; a test module's own ``RNG``
(a module-level NumPy Generator) is seeded anew for each test by the test's name, so what a test
draws does not depend on which tests of its file ran before it (``-k`` selections, single tests).
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

# hypothesis's own caches (source constants, unicode tables) go to a temporary folder, not the checkout
set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), f"sparsile-hypothesis-{os.getuid()}"))
# No deadline in either profile: a per-example time limit fails on a loaded 2-core machine for reasons
# that are not the code's (a flaky test); print_blob so that any failure can be replayed exactly.
settings.register_profile("dev", database=None, deadline=None, print_blob=True)
settings.register_profile("ci", database=None, derandomize=True, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


ROOT = Path(__file__).resolve().parent

# JAX takes 75 % of the GPU's memory at its first GPU array unless told otherwise. GPU tests run in
# several workers at once (scripts/gpu_runs.sh: -n 16), and on an 80 GB card the JAX worker's 61 GB
# left the torch workers out of memory (thirty-ninth session, H100): JAX allocates as it needs here.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def _alias_the_checkout_root() -> None:
    """The checkout root is the package ``sparsile`` itself, but its folder may have any name
    (``sparsile-main``). Before a test runs, pytest imports the ``__init__.py`` of each package
    above it, this one included, under a name made from the folder; where that name is no Python
    identifier it imports the file as a lone module ``__init__``, whose relative imports fail. That
    name is registered here as the installed ``sparsile``, which pytest then takes as it is."""
    try:
        from _pytest.pathlib import module_name_from_path
    except ImportError:  # another pytest layout: nothing to do
        return
    import sparsile

    sys.modules.setdefault(module_name_from_path(ROOT / "__init__.py", ROOT), sparsile)


_alias_the_checkout_root()


@pytest.fixture(autouse=True)
def _seeded_global_generators(request: pytest.FixtureRequest) -> None:
    """The same global random numbers for every test on every run (see the module docstring), and a
    test module's own ``RNG`` (a NumPy Generator at module level) seeded anew for each test by the
    test's name: drawn from one generator in turn, a test's values depended on which tests ran
    before it in that process (the selection, the xdist split), so one could fail alone."""
    import sys
    import zlib

    import numpy as np

    np.random.seed(20261201)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(20261201)
    module = getattr(request, "module", None)
    if isinstance(getattr(module, "RNG", None), np.random.Generator):
        module.RNG = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def _fresh_call_cache() -> None:
    """No test replays another's sparse_matmul call (stdlib/kernels/call_cache.py): a test that
    patches the planning (a table, a launch) then sees its own planning."""
    from sparsile.stdlib.kernels import call_cache

    call_cache.clear()


@functools.cache
def _gpu_available() -> bool:
    try:
        from cuda.bindings import driver
    except Exception:
        return False
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return False
        err, count = driver.cuDeviceGetCount()
        return err == driver.CUresult.CUDA_SUCCESS and count > 0
    except Exception:
        return False


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: a single worker when a GPU is present; otherwise xdist's default (the cores)."""
    return 1 if _gpu_available() else None


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU on this machine")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """``SPARSILE_FAILURES_LOG=path``: each failing test's id and error appended to ``path`` as it
    fails, so that a run stopped at a time limit (pytest then loses its summary) still names its
    failures (scripts/gpu_runs.sh sets it)."""
    path = os.environ.get("SPARSILE_FAILURES_LOG")
    if not path or not report.failed or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # (an xdist worker's reports reach the controller's hook too: written there once)
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"FAILED {report.nodeid} ({report.when})\n{report.longreprtext[-3000:]}\n\n")
