"""The JAX path builds a plan's launcher for the device XLA runs it on (the FFI handler's ordinal,
integrations/jax/call.py ``CallPlan.launcher``) without changing sparsile's current device
(``runtime.use_device``) meanwhile: that is process-wide, and another thread's launch of host
arrays, or a ``sparse_matmul`` call keyed by it, during the build would follow it to XLA's device
(docs/language.md, "Specialization and launching"). A faked two-GPU host: nothing is compiled."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

pytest.importorskip("jax")

from sparsile.backend import runtime
from sparsile.backend.runtime import devices
from sparsile.driver import launch
from sparsile.integrations.jax.call import CallPlan
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
