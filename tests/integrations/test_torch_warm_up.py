"""``sparsile.torch.warm_up`` (integrations/torch/first_call.py): it compiles what a layer's first
eager CUDA call compiles, so that call compiles nothing. Without a GPU the first call is faked as
the launch record tests do: the planners see an H200 (its tuned tables apply), and a prepared
launch only compiles its kernel (``GpuLaunch.prepare`` replaced), so a real ``LaunchRecord``
(integrations/torch/_kernels.py) plans and "prepares" its launches on CPU tensors while the compile
cache counts what it had to compile."""

from __future__ import annotations

import pytest

from sparsile.integrations.errors import IntegrationError

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

from sparsile.backend import runtime  # noqa: E402
from sparsile.driver import cache as cache_mod  # noqa: E402
from sparsile.driver.launch import GpuLaunch  # noqa: E402
from sparsile.integrations.torch import _kernels as kernels  # noqa: E402
from sparsile.integrations.torch import first_call as wu  # noqa: E402
from sparsile.stdlib.kernels import arrays  # noqa: E402
from sparsile.tests.stdlib.test_gemm_tuning import _device  # noqa: E402
from sparsile.tests.support import cache_fixture  # noqa: E402

H200 = _device("NVIDIA H200", (9, 0), 132)


fresh_cache = cache_fixture.fresh_cache  # (an empty default compile cache: tests/support/cache_fixture.py)


@pytest.fixture
def faked_first_call(monkeypatch) -> list[str]:
    """Planners that see an H200, and prepared launches that only compile their kernel for sm_90a;
    returns the kernels compile_function compiled. (The records are built on CPU tensors taken for
    the H200's own: :func:`as_on_the_gpu`.)"""
    monkeypatch.setattr(runtime, "has_gpu", lambda: True)
    monkeypatch.setattr(runtime, "current_device", lambda ordinal=None: H200)
    monkeypatch.setattr(kernels, "native_launch", lambda *args, **kwargs: None)

    class Prepared:
        def run(self, args, stream=None):  # never called: nothing is launched
            raise AssertionError("launched")

    def prepare(self, *args, **kwargs):
        kwargs.pop("per_call", None)
        self.compile_for("sm_90a", *args, **kwargs)
        return Prepared()

    monkeypatch.setattr(GpuLaunch, "prepare", prepare)
    return cache_fixture.spy_compiles(monkeypatch)


def as_on_the_gpu():
    """Around a faked first call: its plans take the CPU tensors for the GPU's own, in place (no host
    copies of x and y), so that the record prepares its launches, and its one-launch eager variants,
    as on the GPU (``arrays.host_tensors_as_device``; warm_up plans a CPU layer so too)."""
    return arrays.host_tensors_as_device()


def _first_call(layer, tokens: int, pdl: bool = False) -> None:
    """What an eager CUDA call of ``layer`` builds before it launches: its launch record (e4m3: the
    record that quantizes x itself, as ``SparseLinear._forward_eager`` asks for up to 64 tokens;
    ``pdl``: as its RecordCache asks with SPARSILE_PDL=1 on a Hopper GPU)."""
    w = layer._bound()
    x = torch.zeros((tokens, layer.in_features), dtype=torch.bfloat16)
    with as_on_the_gpu():
        kernels.LaunchRecord(x, w, None, torch.bfloat16, quantize=w.scale_w is not None, pdl=pdl)


def _model(dtype: str) -> torch.nn.Module:
    return torch.nn.Sequential(spt.SparseLinear(256, 128, bias=False, dtype=dtype),
                               spt.SparseLinear(128, 256, bias=True, dtype=dtype))


@pytest.mark.parametrize("dtype, tokens, pdl", [("bf16", 1, False), ("e4m3", 16, False), ("bf16", 1, True),
                                               ("e4m3", 1, True)])
def test_the_first_call_after_warm_up_compiles_nothing(fresh_cache, faked_first_call, monkeypatch, dtype, tokens,
                                                       pdl) -> None:
    if pdl:  # SPARSILE_PDL=1 on a Hopper GPU: the records plan with PDL, their quantizer with TRIGGER
        monkeypatch.setattr(wu, "pdl_wanted", lambda device: True)
    model = _model(dtype)
    report = wu.warm_up(model, tokens=(tokens,), jobs=1)
    assert report.target == "sm_90a" and report.layers == 2 and report.cached == 0
    assert report.compiled == len(report.kernels) == len(faked_first_call) > 0
    assert "warm_up:" in str(report)
    faked_first_call.clear()
    for layer in model:
        _first_call(layer, tokens, pdl)
    assert faked_first_call == []  # every kernel the records prepared was in the cache
    again = wu.warm_up(model, tokens=(tokens,), jobs=1)
    assert again.compiled == 0 and again.cached == len(report.kernels)


def test_without_warm_up_the_first_call_compiles(fresh_cache, faked_first_call) -> None:
    """The control of the test above: the same first call on a cold cache compiles its kernels."""
    model = _model("bf16")
    _first_call(model[0], 1)
    assert faked_first_call
    expected = {name for name, _ in wu.warm_up(model[:1], tokens=(1,), jobs=1).kernels}
    assert set(faked_first_call) == expected


def test_warm_up_in_worker_processes(fresh_cache, faked_first_call) -> None:
    """jobs=2: worker processes compile into the disk cache, and the first call finds it there."""
    model = _model("bf16")
    report = wu.warm_up(model, tokens=(1,), jobs=2)
    assert report.compiled == len(report.kernels) > 0
    assert faked_first_call == []  # compiled in the workers
    cache_mod.default_cache().clear_memory()
    for layer in model:
        _first_call(layer, 1)
    assert faked_first_call == []


def test_fused_projections_warm_the_fused_layer(fresh_cache, faked_first_call) -> None:
    block = torch.nn.Module()
    block.q_proj, block.k_proj, block.v_proj = (spt.SparseLinear(256, 128, bias=False) for _ in range(3))
    spt.fuse_projections_(block)
    layers = wu.warmed_layers(block)
    assert len(layers) == 1 and layers[0].out_features == 384  # the group's fused layer, not its members


@pytest.mark.parametrize("kwargs, message", [
    ({"model": object()}, "warm_up needs an nn.Module, got object"),
    ({"tokens": 0}, "tokens must be a positive integer or a non-empty sequence of them, got 0"),
    ({"tokens": ()}, "tokens must be a positive integer or a non-empty sequence of them, got ()"),
    ({"tokens": (1, -2)}, "got (1, -2)"),
    ({"tokens": (True,)}, "got (True,)"),
    ({"tokens": "16"}, "got '16'"),
    ({"jobs": 0}, "jobs must be a positive integer or None, got 0"),
    ({"jobs": 1.5}, "jobs must be a positive integer or None, got 1.5"),
    ({"x_dtype": torch.int8}, "x_dtype must be torch.bfloat16, torch.float16 or torch.float32, got torch.int8"),
    ({"target": "sm_12"}, "unknown target 'sm_12'"),
    ({"timeout": 0}, "timeout must be a positive number of seconds or None, got 0"),
    ({"timeout": -1.0}, "got -1.0"),
    ({"timeout": float("inf")}, "got inf"),
    ({"timeout": "60"}, "got '60'"),
    ({"timeout": True}, "got True"),
    ({"calls": "compiled"}, "calls must be 'eager', 'traced' or 'both', got 'compiled'"),
    ({"calls": None}, "got None"),
])
def test_bad_arguments_are_sp0923(kwargs, message) -> None:
    args = {"model": _model("bf16"), **kwargs}
    with pytest.raises(IntegrationError) as err:
        spt.warm_up(args.pop("model"), **args)
    assert err.value.code == "SP0923" and message in err.value.message
    assert err.value.help


@pytest.mark.parametrize(("name", "meant", "chip"), [
    ("hopper", "sm_90a", "Hopper: H100, H200, GH200"), ("H100", "sm_90a", "Hopper: H100, H200, GH200"),
    ("blackwell", "sm_100a", "Blackwell: "),
])
def test_a_gpu_name_for_target_suggests_its_target(name, meant, chip) -> None:
    """warm_up(target="hopper") is SP0923 whose help names the target to write, as SP0601 of
    ``get_target`` does (it said only 'e.g. target="sm_90a" (Hopper)', whatever the name)."""
    with pytest.raises(IntegrationError) as err:
        spt.warm_up(_model("bf16"), target=name)
    assert (err.value.code, err.value.message) == ("SP0923", f"unknown target {name!r}")
    assert err.value.help.startswith(f"did you mean `{meant}`? ({chip}")
    assert err.value.help.count("did you mean") == 1
    assert err.value.help.endswith("or leave it unset for the layers' GPU")


def test_a_misspelt_target_suggests_the_closest() -> None:
    with pytest.raises(IntegrationError) as err:
        spt.warm_up(_model("bf16"), target="sm_100b")
    assert (err.value.code, err.value.message) == ("SP0923", "unknown target 'sm_100b'")
    assert err.value.help.startswith("did you mean `sm_100")


def test_a_target_plans_for_that_target() -> None:
    """warm_up(target="sm_100a") on a host without a GPU plans the Blackwell kernels (no decode kernel,
    no gated epilogue there), not Hopper's compiled for another architecture."""
    layer = spt.SparseLinear(256, 128, bias=False)
    for tokens in (1, 100):
        hopper = wu.first_call_launches(layer, tokens)
        blackwell = wu.first_call_launches(layer, tokens, target="sm_100a")
        assert all("sm90" in launch[0].source.name for launch in hopper)
        assert blackwell and all("sm100" in launch[0].source.name for launch in blackwell)


HUNG_WORKER = ("from sparsile.driver import compile_pool; import time\n"
               "replies = compile_pool._reply_stream()\n"
               "compile_pool._send(replies, 0.0)  # started\n"
               "time.sleep(3600)  # and never replies")


def test_a_hung_worker_is_sp0924_naming_its_kernel(fresh_cache, faked_first_call, monkeypatch) -> None:
    """Workers that start and then never reply: each is killed ``timeout`` seconds after it was handed
    a kernel, the kernels no worker compiled are compiled here, and SP0924 names the hung ones. Before,
    warm_up waited for the reply for ever."""
    from sparsile.driver import compile_pool

    monkeypatch.setattr(compile_pool, "_WORKER", HUNG_WORKER)
    model = _model("e4m3")[:1]
    names = [name for name, _ in wu.warm_up(model, tokens=(1,), jobs=1).kernels]
    assert len(names) >= 3  # the quantizer and the GEMMs: the two workers get one each, this process the rest
    cache_mod.reset_default_cache()  # (the same folder: empty it)
    for entry in cache_mod.default_cache().directory.rglob("*"):
        if entry.is_file():
            entry.unlink()
    faked_first_call.clear()
    done: list = []

    def warm() -> None:
        with pytest.raises(IntegrationError) as err:
            wu.warm_up(model, tokens=(1,), jobs=2, timeout=0.5)
        done.append(err.value)

    import threading

    thread = threading.Thread(target=warm, daemon=True)
    thread.start()
    thread.join(120)
    assert done, "warm_up hung"
    err = done[0]
    assert err.code == "SP0924" and "within timeout=0.5 s" in err.message and err.help
    assert f"the other {len(names) - 2} compiled" in err.message
    hung = [name for name in dict.fromkeys(names) if f"{name} {{" in err.message]
    assert len(hung) == 2 and set(faked_first_call) == set(names) - set(hung)  # the rest compiled here
    for layer in model:
        for launch, spec in wu.distinct_specializations(wu.first_call_launches(layer, 1)):
            assert spec.cached("sm_90a") == (launch[0].name not in hung)


def test_each_layer_compiles_for_the_gpu_its_weight_lives_on(monkeypatch) -> None:
    """A model split over two GPUs of different architectures (device 0 a B200, device 1 an H200,
    faked as tests/stdlib/test_plan_device.py fakes them): each layer's kernels are planned and
    compiled for its own GPU. Before, every layer was compiled for the first CUDA layer's target
    (here, the layers being CPU tensors: sm_90a), the B200's Blackwell kernels among them."""
    from sparsile.stdlib.kernels import plan_device
    from sparsile.tests.stdlib.test_plan_device import GPUS

    model = _model("bf16")
    ordinal = {id(model[0].values): 1, id(model[1].values): 0}  # layer 0 on the H200, layer 1 on the B200
    monkeypatch.setattr(runtime, "has_gpu", lambda: True)
    monkeypatch.setattr(runtime, "current_device", lambda o=None: GPUS[0 if o is None else o])
    monkeypatch.setattr(plan_device, "device_ordinal", lambda a: ordinal.get(id(a)))
    compiled: list[tuple[str, str]] = []

    def compile_specializations(specs, targets, jobs, timeout=None):
        targets = [targets] * len(specs) if isinstance(targets, str) else targets
        compiled.extend((spec.kernel.source.name, target) for spec, target in zip(specs, targets, strict=True))

    monkeypatch.setattr(wu, "compile_specializations", compile_specializations)
    report = wu.warm_up(model, tokens=(1, 100), jobs=1)
    assert report.target == "sm_90a, sm_100a" and report.compiled == len(compiled) > 0
    assert {target for _, target in compiled} == {"sm_90a", "sm_100a"}
    for source, target in compiled:
        assert ("sm100" in source) == (target == "sm_100a"), (source, target)
    assert [wu.layer_target(layer) for layer in model] == ["sm_90a", "sm_100a"]
