"""The one GPU a tuner works on (``sparsile tune``, :func:`~.tuning.tune_sparse_matmul`,
:func:`~.linear_tuning.tune_sparse_linear`, :func:`~.decode_tuning.tune_sparse_decode`).

A tuner allocates its operands, times its launches and keys its table with one device: the one its
``device=`` argument (``sparsile tune --device N``) names, else sparsile's current device
(``runtime.use_device``, cuda:0 by default), whatever torch's or CuPy's current device. Its launches
follow their arrays' device (docs/language.md, "Specialization and launching"), so operands made on
that device run there; torch's current device is that device too while the tuner runs (its
streams and CUDA graphs), and the table's GPU name and SM count are that device's (docs/autotune.md).
A ``benchmarker=`` given to a tuner sees that device as sparsile's and torch's current device while
it runs (:func:`timer`).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ...backend.runtime.bench import Benchmarker, on_device
from ...backend.runtime.codes import NO_GPU
from ...frontend.diagnostics import LaunchError


def tuning_ordinal(device: Any = None) -> int:
    """The ordinal of the GPU to tune on: ``device`` when given, else sparsile's current device.
    SP0716 for one that is no visible device (or no device ordinal at all)."""
    from ...backend import runtime

    device = _cuda_index(device)
    if device is None:
        return runtime.devices.default_ordinal
    try:
        if isinstance(device, bool):
            raise TypeError
        ordinal = operator.index(device)
    except TypeError:
        raise LaunchError(NO_GPU, f"device={device!r} is no CUDA device ordinal",
                          help="give the GPU's index, e.g. device=1, torch.device(\"cuda\", 1) or \"cuda:1\" "
                                "(sparsile tune --device 1)") from None
    runtime.current_device(ordinal)  # SP0716 naming how many GPUs are visible, for one that is not
    return ordinal


def _cuda_index(device: Any) -> Any:
    """torch's spellings of a GPU: ``torch.device("cuda", 1)`` and ``"cuda:1"`` give 1, ``"cuda"``
    (no index) None (sparsile's current device); anything else is returned as given."""
    kind, index = getattr(device, "type", None), getattr(device, "index", None)
    if isinstance(device, str):
        kind, _, text = device.partition(":")
        index = int(text) if text.isdigit() else (None if not text else device)
    if kind != "cuda" or isinstance(index, str):
        return device
    return index


@contextmanager
def torch_on(ordinal: int) -> Iterator[str]:
    """torch's current device is ``ordinal`` inside (its streams, generators and graphs); yields the
    device string (``cuda:1``) to allocate the operands with."""
    import torch

    with torch.cuda.device(ordinal):
        yield f"cuda:{ordinal}"


def timer(benchmarker: Benchmarker | None, ordinal: int, default: Benchmarker) -> Benchmarker:
    """What a tuner of GPU ``ordinal`` times with: ``default`` (its own timer, which finds the device
    itself), or the caller's ``benchmarker`` run with ``ordinal`` as sparsile's and torch's current
    device (backend/runtime/bench.py ``on_device``): a benchmarker's contract names no device, so it
    times with the current one's events (docs/autotune.md), which were sparsile's current device
    (``use_device``), not the tuned one."""
    return default if benchmarker is None else on_device(benchmarker, ordinal)
