"""The JAX path builds a plan's launcher for the device XLA runs it on (the FFI handler's ordinal,
integrations/jax/plan.py ``CallPlan.launcher``) without changing sparsile's current device
(``runtime.use_device``) meanwhile: that is process-wide, and another thread's launch of host
arrays, or a ``sparse_matmul`` call keyed by it, during the build would follow it to XLA's device
(docs/language.md, "Specialization and launching"). A faked two-GPU host: nothing is compiled."""

from __future__ import annotations

import dataclasses
import importlib
from types import SimpleNamespace

import pytest

pytest.importorskip("jax")

from sparsile.backend import runtime
from sparsile.backend.runtime import devices
from sparsile.driver import launch
from sparsile.integrations.jax.plan import CallPlan
from sparsile.tests.backend.test_prepared import H200

GPUS = {0: H200, 1: dataclasses.replace(H200, ordinal=1)}


def test_a_launcher_for_xlas_device_leaves_the_current_device_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "default_ordinal", 0)
    seen: list[tuple[int | None, int]] = []  # (the device the module is loaded on, the current device then)

    def current_device(ordinal: int | None = None) -> runtime.DeviceInfo:
        return GPUS[devices.default_ordinal if ordinal is None else ordinal]

    def use_device(ordinal: int) -> runtime.DeviceInfo:
        devices.default_ordinal = ordinal
        return GPUS[ordinal]

    def build(kernel, bindings, key, target, options, ordinal=None):
        seen.append((devices.default_ordinal if ordinal is None else ordinal, devices.default_ordinal))
        assert target.name == "sm_90a"
        return SimpleNamespace(spec=SimpleNamespace(params=[]))

    monkeypatch.setattr(runtime, "current_device", current_device)
    monkeypatch.setattr(runtime, "use_device", use_device)
    monkeypatch.setattr(launch, "_build_launcher", build)
    plan = CallPlan(SimpleNamespace(options={}), {}, (), {}, (1, 1, 1), [], [], {})
    built = plan.launcher(1)
    assert seen == [(1, 0)]  # loaded on XLA's device 1; sparsile's current device stayed 0 throughout
    assert plan.launcher(1) is built and devices.default_ordinal == 0


class _XlaDevice:
    def __init__(self, ordinal: int, process_index: int = 0):
        self.local_hardware_id, self.process_index = ordinal, process_index


@pytest.mark.parametrize("assignment, built", [
    ((_XlaDevice(1),), [1]),  # jit on cuda:1: its module loaded there, none on sparsile's current device 0
    ((_XlaDevice(1), _XlaDevice(0)), [1, 0]),  # a computation over two GPUs: each one's, once
    ((_XlaDevice(1), _XlaDevice(0, process_index=1)), [1]),  # another process's device: not this one's
    (None, [0]),  # XLA does not say: the current device, as before
])
def test_the_lowering_loads_the_kernel_on_the_devices_xla_lowers_for(monkeypatch: pytest.MonkeyPatch, assignment,
                                                                     built) -> None:

    jax_call = importlib.import_module("sparsile.integrations.jax.primitive")  # (the lowering rules)
    monkeypatch.setattr(devices, "default_ordinal", 0)
    monkeypatch.setattr(runtime, "current_device", lambda ordinal=None: GPUS[0 if ordinal is None else ordinal])
    monkeypatch.setattr(jax_call.ffi, "register", lambda platform: None)
    lowered = SimpleNamespace(ffi_lowering=lambda *a, **k: lambda ctx, *operands, **attrs: "lowered")
    monkeypatch.setattr(jax_call.ffi, "jax_ffi", lambda: lowered)
    loads: list[int] = []
    plan_id = 10**9 + 7
    monkeypatch.setitem(jax_call._PLANS, plan_id, SimpleNamespace(launcher=loads.append))
    ctx = SimpleNamespace(module_context=SimpleNamespace(axis_context=SimpleNamespace(device_assignment=assignment)))
    assert jax_call._ffi_rule("cuda")(ctx, plan=plan_id, out_avals=(), interpret=False, aliases=()) == "lowered"
    assert loads == built
