"""Stale fast entries of ``kernel[grid](...)`` (driver/fast_launch.py): two calls whose arguments have
the same fingerprint but differ in something the first call's entry decided for all later calls.
Fake device of tests/backend/test_prepared.py (kernels compile for sm_90a, launches are recorded)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch")

from sparsile.backend.runtime import arrays as array_args
from sparsile.backend.runtime import launcher as launcher_module
from sparsile.tests.backend.test_prepared import TORCH_STREAM, FakeCudaTensor, gpu, vadd  # noqa: F401

STAGED = 0x6000_0000_0000
"""Where the fake staging puts a host array's device copy."""


class FakeTensor(FakeCudaTensor):
    """One class for torch tensors on the CPU and on the GPU, as ``torch.Tensor`` is: ``on_cpu`` gives
    a CPU tensor over real host memory (``host``), which the launcher copies to the device."""

    def __init__(self, ptr, shape, on_cpu=False, host=None):
        super().__init__(ptr, shape)
        self.is_cuda = not on_cpu
        self.device = SimpleNamespace(type="cpu" if on_cpu else "cuda")
        self.host = host

    def get_device(self):
        return -1 if not self.is_cuda else self._device


def _fake_staging(name, info, writes, call, device):
    """The launcher's host copy, without a GPU: a made-up device address (nothing to copy back)."""
    return STAGED


@pytest.fixture
def torch_like(gpu, monkeypatch):  # noqa: F811
    monkeypatch.setitem(array_args._extractors, FakeTensor, array_args._describe_torch)
    monkeypatch.setattr(launcher_module, "stage_host_array", _fake_staging)
    return gpu


def _cpu(n=1024):
    host = np.random.default_rng(0).random(n, dtype=np.float32) + 0.5
    return FakeTensor(host.ctypes.data, (n,), on_cpu=True, host=host)


def test_cuda_tensors_after_a_call_of_cpu_tensors_launch_on_torchs_stream(torch_like):
    """CPU and CUDA torch tensors have one class, dtype, rank and alignment: one fingerprint on a host of
    one GPU. A first call of CPU tensors (copied by the launcher, on the legacy default stream: no CUDA
    tensor names a torch stream) filed a fast entry that launched every later call of that fingerprint
    on the legacy default stream, CUDA tensors too: not ordered after torch's current (non-blocking)
    stream, whose work produces x and consumes out. The full path launches those on torch's stream."""
    k = vadd()
    x, y, out = _cpu(), _cpu(), _cpu()
    k[(4,)](x, y, out, 1024, BLOCK=256)
    assert torch_like.launches[-1]["stream"] == 0  # host arrays only: the legacy default stream
    cx, cy, cout = (FakeTensor(0x7F00_0000_0000 + i * 0x10000, (1024,)) for i in range(3))
    for _ in range(2):
        k[(4,)](cx, cy, cout, 1024, BLOCK=256)
        assert torch_like.launches[-1]["stream"] == TORCH_STREAM
        assert torch_like.launches[-1]["params"][0] == cx.data_ptr().to_bytes(8, "little")
    k[(4,)](x, y, out, 1024, BLOCK=256)  # CPU tensors again: copied, the copy launched
    assert torch_like.launches[-1]["params"][0] == STAGED.to_bytes(8, "little")
    assert len(torch_like.built) == 1 and len(torch_like.launches) == 4


def _negated(t):
    """``torch._neg_view(t)`` of a fake CUDA tensor: the same memory, its negative bit set."""
    view = FakeTensor(t.data_ptr(), tuple(t.shape))
    view.negated = True
    return view


def test_a_neg_view_after_a_call_of_its_fingerprint_is_refused_not_read_without_its_negation(torch_like):
    """A torch tensor with its negative bit set (``torch._neg_view(t)``, ``z.conj().imag``) has a plain
    tensor's class, dtype, rank and alignment: the fingerprint of the call before it. Its memory holds
    the values before the negation, which a launch reads by pointer: the fast entry (and the full
    path) launched it as if it were ``t``, a silent wrong result. It is refused (SP0751), as a view the
    launcher cannot read in place, on every path; the plain tensors still take the fast entry."""
    from sparsile.frontend.diagnostics import LaunchError

    k = vadd()
    x, y, out = (FakeTensor(0x7F00_0000_0000 + i * 0x10000, (1024,)) for i in range(3))
    k[(4,)](x, y, out, 1024, BLOCK=256)
    k[(4,)](x, y, out, 1024, BLOCK=256)  # the fast entry
    launches = len(torch_like.launches)
    for call in (lambda: k[(4,)](_negated(x), y, out, 1024, BLOCK=256),  # the fast entry's fingerprint
                 lambda: k[(4,)](x, y, _negated(out), 1024, BLOCK=256),
                 lambda: k[(4,)](_negated(x), y, out, 1000, BLOCK=256),  # another fingerprint: the full path
                 lambda: k[(4,)].prepare(x, y, out, 1024, BLOCK=256)(_negated(x), y, out, 1024),
                 lambda: k[(4,)](_cpu(), _negated(_cpu()), _cpu(), 1024, BLOCK=256)):  # a host copy's source
        with pytest.raises(LaunchError) as info:
            call()
        assert info.value.code == "SP0751"
        assert info.value.message.startswith(("argument `x` is a torch tensor with its negative",
                                              "argument `y` is a torch tensor with its negative",
                                              "argument `out` is a torch tensor with its negative"))
        assert ".resolve_neg()" in info.value.help
    assert len(torch_like.launches) == launches
    k[(4,)](x, y, out, 1024, BLOCK=256)
    assert torch_like.launches[-1]["params"][0] == x.data_ptr().to_bytes(8, "little")


def test_the_interpreter_reads_and_writes_a_neg_view_with_its_negation():
    """The interpreter reads a neg view through a copy with the negation applied (as it reads other
    arrays it cannot use in place) and writes the result back through the view; a plain call first
    (its conversions keyed by memory: a neg view shares its base's) changes nothing."""
    import torch

    k = vadd()
    rng = np.random.default_rng(5)
    base = torch.from_numpy(rng.uniform(0.5, 2.0, 300).astype(np.float32) * rng.choice([-1, 1], 300).astype(np.float32))
    y = torch.from_numpy(rng.uniform(0.5, 2.0, 300).astype(np.float32))
    out = torch.full((300,), float("nan"))
    k.interpret[(2,)](base, y, out, 300, BLOCK=256)
    np.testing.assert_allclose(out.numpy(), base.numpy().astype(np.float64) + y.numpy(), rtol=2**-23)
    k.interpret[(2,)](torch._neg_view(base), y, out, 300, BLOCK=256)
    np.testing.assert_allclose(out.numpy(), -base.numpy().astype(np.float64) + y.numpy(), rtol=2**-23)
    k.interpret[(2,)](base, torch._neg_view(base), out, 300, BLOCK=256)  # one memory, two values
    np.testing.assert_array_equal(out.numpy(), np.zeros(300, np.float32))
    store = torch.full((300,), float("nan"))
    k.interpret[(2,)](base, y, torch._neg_view(store), 300, BLOCK=256)
    np.testing.assert_allclose(store.numpy(), -(base.numpy().astype(np.float64) + y.numpy()), rtol=2**-23)


def _torch_subclass():
    """A torch.Tensor subclass never described before (as ``torch.Tensor`` is in a fresh process):
    an instance made with ``on_gpu`` says it is a CUDA tensor of device 0 at a made-up address; the
    others are the CPU tensors they are."""
    import torch

    class FirstSeen(torch.Tensor):
        __torch_function__ = torch._C._disabled_torch_function_impl

        @property
        def is_cuda(self):
            return self.__dict__.get("on_gpu", False)

        def get_device(self):
            return 0 if self.is_cuda else -1

        def data_ptr(self):
            return self.__dict__["address"] if self.is_cuda else super().data_ptr()

    def make(on_gpu, i):
        t = torch.Tensor._make_subclass(FirstSeen, torch.rand(1024) + 0.5)
        if on_gpu:
            t.on_gpu, t.address = True, 0x7F00_0000_0000 + i * 0x10000
        return t

    return FirstSeen, make


def test_a_torch_class_is_torchs_before_its_first_description(torch_like):
    """Whether a class is torch's was read from the cache ``describe_array`` fills, so a class never
    described yet (torch.Tensor in a fresh process) was not torch's: a first call of CPU tensors
    filed its fast entry as one of host arrays of no torch stream, and every later call of CUDA
    tensors of that fingerprint launched on the legacy default stream, not torch's current one."""
    from sparsile.backend.runtime.arguments import is_torch_type

    cls, make = _torch_subclass()
    assert is_torch_type(cls)
    k = vadd()
    k[(4,)](*(make(False, i) for i in range(3)), 1024, BLOCK=256)
    assert torch_like.launches[-1]["stream"] == 0  # host arrays only: the legacy default stream
    gpu_args = [make(True, i) for i in range(3)]
    for _ in range(2):
        k[(4,)](*gpu_args, 1024, BLOCK=256)
        assert torch_like.launches[-1]["stream"] == TORCH_STREAM
        assert torch_like.launches[-1]["params"][0] == gpu_args[0].data_ptr().to_bytes(8, "little")
