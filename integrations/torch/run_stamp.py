"""The stamp of a fused run of ``fuse_projections_`` (projection_group.py): what the run's outputs depend on
besides x's identity and version, compared before a sibling is served columns of that run."""

from __future__ import annotations

from typing import Any

import torch

from ._kernels import capture_id, capturing
from .linear import tensors_of
from .noted_streams import lasting, stream_id


def run_stamp(fused: Any, x: torch.Tensor) -> tuple[Any, ...]:
    """What a fused run's outputs depend on besides x's identity and version, compared before a
    sibling is served from it: grad mode (a run under ``torch.no_grad()`` is off the autograd graph),
    inference mode (a run under ``torch.inference_mode()`` made inference tensors, which a sibling
    called outside it could not write in place, as its unfused output can be), whether x requires
    grad (a leaf x made to require it between sibling calls, by a forward pre-hook say, changes
    neither: a sibling was served columns off the graph, x's gradient lacked its part; or, made not
    to, columns on it) and the version counters of the fused buffers (a member's buffers are views of
    them and share their counters: a write to a member's weight, bias or scales between sibling
    calls; inference tensors keep none), x's memory (address, shape, strides, dtype: ``x.data = t`` gives
    the same object other memory without a version bump; a sibling was served the run of x's old
    memory, outputs of another input and even of another shape, or, for ``x.data = x.view(torch.float16)``
    of a bfloat16 x, the bfloat16 outputs of the old numbers), and, for CUDA x, which CUDA graph
    is being captured, if any (its capture id), and torch's current stream, one somebody else owns by
    its driver id too (a sibling called inside a capture, or in another capture than the run's, the
    same static x fed to two graphs captured one after the other, or on another stream, was served
    columns whose launch is not in its graph, or runs on the other stream; a new stream under a
    destroyed one's handle is another stream: :func:`stream_named`)."""
    b = tensors_of(fused.__dict__)  # (not fused.values: nn.Module.__getattr__ cost 0.7 us a name, and no
    # generator: the stamp is taken once per member call, 5.3 us before, 0.7 us now on a slow host; .get: a
    # name a parametrization moved out is no KeyError, and its tensor is computed anew on each access anyway)
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), x.requires_grad,
            counter(b.get("values")), counter(b.get("meta")), counter(b.get("bias")), counter(b.get("scale_w")),
            x.data_ptr(), x.shape, x.stride(), x.dtype, *stream_and_capture(fused, x))


def stream_and_capture(fused: Any, x: torch.Tensor) -> tuple[Any, tuple[int | None] | None]:
    """(torch's current stream on CUDA x's device, or None; (the id of the CUDA graph it captures,)
    or None outside a capture) for :func:`run_stamp`. The capture id is asked only inside a capture.
    Outside one, a stream somebody else owns is named as ``(handle, driver id)`` (:func:`stream_named`);
    a stream found lasting costs one set lookup more than the handle alone (about 20 ns on a slow host)."""
    records = fused.__dict__["_records"]
    stream = records.stream_of(x.get_device())() if x.is_cuda else None  # (its cached getter)
    if stream is None or stream in records.lasting:
        return stream, ((capture_id(stream),) if capturing() else None)
    if capturing():
        return stream, (capture_id(stream),)
    return stream_named(records, stream, x.get_device()), None


def stream_named(records: Any, stream: int, ordinal: int) -> Any:
    """``stream`` (torch's current stream on CUDA device ``ordinal``, not capturing) as the run stamp
    names it: its handle where it lives as long as the process (noted_streams.lasting: the default
    streams, torch's own; noted in the fused layer's record cache, ``records.lasting``, so that it is
    asked once: such a handle is never freed, so never another stream's), else ``(handle, its driver
    id)`` (noted_streams.stream_id, asked on each stamp): its owner may destroy it and the driver give
    the handle to a new stream, and a sibling called there with the same x was served columns of the
    run launched on the old one, which the new stream's work read with no wait for it (a race)."""
    if lasting(stream, ordinal):
        records.lasting.add(stream)  # (bounded: torch's streams of a device are a fixed pool)
        return stream
    return stream, stream_id(stream)


def counter(t: torch.Tensor | None) -> int:
    """A tensor's version counter (-1 for none, or an inference tensor, which keeps none: x's identity
    alone then): a fused buffer's, and x's (projection_group.py)."""
    return -1 if t is None or t.is_inference() else t._version
