"""Tests for target/targets.py: the table, lookups, diagnostics, and a ptxas cross-check."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from sparsile.frontend.diagnostics import CompileError
from sparsile.frontend.spans import SourceFile, Span
from sparsile.target import targets as T
from sparsile.target.targets import Feature

# One PTX instruction per feature (docs/hardware.md §1.1, §2, §4, §5, §7 syntax).
PTX_PROBES: dict[Feature, str] = {
    Feature.MMA_SP: "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 "
                    "{%f0,%f1,%f2,%f3}, {%r0,%r1,%r2,%r3}, {%r4,%r5,%r6,%r7}, {%f4,%f5,%f6,%f7}, %r8, 0x0;",
    Feature.CP_ASYNC: "cp.async.ca.shared.global [%rd1], [%rd2], 16;",
    Feature.WGMMA: "wgmma.fence.sync.aligned;",
    Feature.TMA: "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[%rd1], [%rd2, {%r1, %r2}], [%rd3];",
    Feature.TMA_CTA_GROUP: "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                           ".cta_group::2 [%rd1], [%rd2, {%r1, %r2}], [%rd3];",
    Feature.MBARRIER: "mbarrier.init.shared::cta.b64 [%rd1], 1;",
    Feature.MBARRIER_TX: "mbarrier.try_wait.parity.shared::cta.b64 %p1, [%rd1], 0;",
    Feature.CLUSTER: "barrier.cluster.arrive;",
    Feature.ELECT: "elect.sync %r1|%p1, 0xffffffff;",
    Feature.SETMAXNREG: "setmaxnreg.inc.sync.aligned.u32 232;",
    Feature.FENCE_PROXY_ASYNC: "fence.proxy.async.shared::cta;",
    Feature.GRID_DEPENDENCY: "griddepcontrol.wait;\ngriddepcontrol.launch_dependents;",
    Feature.TCGEN05: "tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%rd1], 32;\n"
                     "tcgen05.mma.sp.cta_group::1.kind::f16 [%r1], %rd1, %rd2, [%r2], %r3, 1;\n"
                     "tcgen05.mma.sp.cta_group::1.kind::f8f6f4 [%r1], %rd1, %rd2, [%r2], %r3, 1;",
    Feature.TCGEN05_I8: "tcgen05.mma.sp.cta_group::1.kind::i8 [%r1], %rd1, %rd2, [%r2], %r3, 1;",
    Feature.TCGEN05_MXF8F6F4: "tcgen05.mma.sp.cta_group::1.kind::mxf8f6f4.block_scale.block32 "
                              "[%r1], %rd1, %rd2, [%r2], %r3, [%r4], [%r5], 1;",
    Feature.TCGEN05_MXF4: "tcgen05.mma.sp.cta_group::1.kind::mxf4nvf4.block_scale.block16 "
                          "[%r1], %rd1, %rd2, [%r2], %r3, [%r4], [%r5], 1;",
    Feature.TCGEN05_SCALE_VEC: "tcgen05.mma.sp.cta_group::1.kind::mxf8f6f4.block_scale.scale_vec::1X "
                               "[%r1], %rd1, %rd2, [%r2], %r3, [%r4], [%r5], 1;",
    Feature.TCGEN05_SCALE_D: "tcgen05.mma.sp.cta_group::1.kind::f16 [%r1], %rd1, %rd2, [%r2], %r3, 1, 3;",
    Feature.TCGEN05_SHIFT: "tcgen05.shift.cta_group::1.down [%r1];",
    Feature.FP8_CVT: ".reg .b16 %h<4>;\ncvt.rn.satfinite.e4m3x2.f32 %h1, %f1, %f2;\ncvt.rn.f16x2.e5m2x2 %r1, %h2;",
    Feature.TCGEN05_LD_RED: "tcgen05.ld.red.sync.aligned.32x32b.x2.min.f32 {%f1,%f2}, %f3, [%r1];",
}


def test_every_feature_has_a_probe():
    assert set(PTX_PROBES) == set(Feature)


def _probe_module(target: T.Target) -> tuple[str, dict[Feature, range]]:
    """One PTX file with one kernel per feature; returns it and each kernel's line range."""
    major, minor = target.ptx_version
    lines = [f".version {major}.{minor}", f".target {target.name}", ".address_size 64"]
    spans: dict[Feature, range] = {}
    for i, (feature, body) in enumerate(PTX_PROBES.items()):
        start = len(lines) + 1
        lines += [f".visible .entry k{i}()", "{",
                  ".reg .b32 %r<20>; .reg .b64 %rd<20>; .reg .f32 %f<20>; .reg .pred %p<4>;",
                  *body.splitlines(), "ret;", "}"]
        spans[feature] = range(start, len(lines) + 1)
    return "\n".join(lines) + "\n", spans


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not installed")
@pytest.mark.parametrize("name", list(T.TARGETS))
def test_feature_table_matches_ptxas(name, tmp_path):
    """Each feature is in the target's set exactly when ptxas assembles its probe instruction."""
    target = T.TARGETS[name]
    text, spans = _probe_module(target)
    src = tmp_path / "probe.ptx"
    src.write_text(text)
    proc = subprocess.run(["ptxas", f"-arch={target.arch_option}", str(src), "-o", str(tmp_path / "p.cubin")],
                          capture_output=True, text=True, timeout=120)
    bad_lines = {int(m) for m in re.findall(r"line (\d+); error", proc.stderr)}
    assert proc.returncode == 0 or bad_lines, proc.stderr
    rejected = {f for f, rng in spans.items() if any(line in rng for line in bad_lines)}
    accepted = set(PTX_PROBES) - rejected
    assert accepted == set(target.features), (
        f"ptxas accepts {sorted(f.name for f in accepted - target.features)} not in the table; "
        f"table claims {sorted(f.name for f in target.features - accepted)} that ptxas rejects")


# docs/hardware.md §7 tcgen05 availability table, transcribed by hand (columns 100a .. 120a).
_S7_COLUMNS = ["sm_100a", "sm_100f", "sm_103a", "sm_103f", "sm_110a", "sm_110f", "sm_120a"]
_S7_ROWS = {
    Feature.TCGEN05:           "YYYYYY.",
    Feature.TCGEN05_MXF8F6F4:  "YYYYYY.",
    Feature.TCGEN05_I8:        "Y...Y..",
    Feature.TCGEN05_MXF4:      "Y.Y.Y..",
    Feature.TCGEN05_SCALE_VEC: "Y.Y.Y..",
    Feature.TCGEN05_SCALE_D:   "YYYY...",
    Feature.TCGEN05_SHIFT:     "Y.Y.Y..",
    Feature.TCGEN05_LD_RED:    "..YYYY.",
}


@pytest.mark.parametrize("feature", list(_S7_ROWS))
def test_tcgen05_rows_follow_section_7(feature):
    for column, mark in zip(_S7_COLUMNS, _S7_ROWS[feature]):
        assert (feature in T.TARGETS[column].features) == (mark == "Y"), (feature, column)


def test_wgmma_only_on_sm90a_and_tcgen05_never_on_hopper_or_sm12x():
    assert [t.name for t in T.targets_with(Feature.WGMMA)] == ["sm_90a"]
    for name in ("sm_80", "sm_90", "sm_90a", "sm_120", "sm_120a", "sm_121a", "sm_100", "sm_103"):
        assert Feature.TCGEN05 not in T.TARGETS[name].features


def test_hopper_features_shared_with_blackwell():
    for name in ("sm_90a", "sm_100a", "sm_100f", "sm_103a"):
        feats = T.TARGETS[name].features
        assert {Feature.TMA, Feature.MBARRIER_TX, Feature.ELECT, Feature.SETMAXNREG} <= feats
    assert Feature.ELECT in T.TARGETS["sm_120a"].features
    assert Feature.SETMAXNREG in T.TARGETS["sm_120a"].features
    assert Feature.SETMAXNREG not in T.TARGETS["sm_90"].features
    assert Feature.MMA_SP in T.TARGETS["sm_80"].features
    assert Feature.TMA not in T.TARGETS["sm_89"].features


def test_toolchain_strings():
    t = T.get_target("sm_100a")
    assert (t.major, t.minor, t.capability, t.sm) == (10, 0, (10, 0), 100)
    assert t.arch_specific and not t.family
    assert (t.llvm_cpu, t.llvm_features, t.nvjitlink_arch, t.arch_option) == (
        "sm_100a", "+ptx88", "-arch=sm_100a", "sm_100a")
    f = T.get_target("sm_103f")
    assert f.family and not f.arch_specific and f.capability == (10, 3)
    # §7: sm_110a needs PTX 9.0.
    assert T.get_target("sm_110a").llvm_features == "+ptx90"
    assert T.get_target("sm_110a").ptx_version == (9, 0)
    assert T.get_target("sm_80").ptx_version == (8, 8)
    assert T.get_target("sm_121a").capability == (12, 1)


def test_resources():
    assert T.get_target("sm_80").resources.max_smem_per_block_optin == 163 * 1024
    assert T.get_target("sm_90a").resources.max_smem_per_block_optin == 227 * 1024
    assert T.get_target("sm_100a").resources.max_smem_per_block_optin == 227 * 1024
    assert T.get_target("sm_120a").resources.max_smem_per_block_optin == 99 * 1024
    assert T.get_target("sm_100a").resources.tmem_columns == 512
    assert T.get_target("sm_100a").resources.tmem_lanes == 128
    assert T.get_target("sm_100").resources.tmem_columns == 0
    assert T.get_target("sm_90a").resources.tmem_columns == 0
    for t in T.TARGETS.values():
        assert t.resources.max_registers_per_thread == 255
        assert t.resources.max_threads_per_block == 1024
        assert t.resources.max_smem_per_block_optin < t.resources.smem_per_sm
        assert (t.resources.tmem_columns > 0) == (Feature.TCGEN05 in t.features)


@pytest.mark.parametrize("spelling", ["sm_100a", "SM_100A", "sm100a", "100a", " sm_100a ", "compute_100a"])
def test_get_target_spellings(spelling):
    assert T.get_target(spelling) is T.TARGETS["sm_100a"]


def test_get_target_passes_targets_through():
    t = T.TARGETS["sm_90a"]
    assert T.get_target(t) is t


def test_unknown_target_suggests_closest():
    src = SourceFile("k.spk", "target = sm_100b\n")
    span = Span(src, 1, 10, 1, 17)
    with pytest.raises(CompileError) as info:
        T.get_target("sm_100b", span)
    diag = info.value.diagnostics[0]
    assert diag.code == "SP0601"
    assert "sm_100b" in diag.message
    assert "did you mean `sm_100" in diag.help
    assert "sm_90a" in diag.help  # lists known targets
    assert diag.span == span
    assert "k.spk:1:10" in str(info.value)


@pytest.mark.parametrize("name", ["foo", "bar", "x"])
def test_a_name_unlike_every_target_gets_no_suggestion(name):
    """Every normalized name starts with `sm_`: compared with it, `foo` came close to `sm_121f`."""
    with pytest.raises(CompileError) as info:
        T.get_target(name)
    assert "did you mean" not in info.value.diagnostics[0].help


@pytest.mark.parametrize(("name", "meant", "chip"), [
    ("hopper", "sm_90a", "Hopper"), ("H100", "sm_90a", "Hopper"), ("h200", "sm_90a", "Hopper"),
    ("NVIDIA H100", "sm_90a", "Hopper"), ("blackwell", "sm_100a", "Blackwell"), ("b200", "sm_100a", "Blackwell"),
    ("ampere", "sm_80", "Ampere"), ("A100", "sm_80", "Ampere"),
])
def test_a_gpu_or_architecture_name_suggests_its_target(name, meant, chip):
    """A product or architecture name is SP0601 whose help names the target to write (h100 and a100 were
    "did you mean `sm_100`?", a Blackwell target, by spelling alone; hopper, blackwell, ampere had no
    suggestion)."""
    src = SourceFile("k.spk", f"target = {name}\n")
    span = Span(src, 1, 10, 1, 10 + len(name))
    with pytest.raises(CompileError) as info:
        T.get_target(name, span)
    (diag,) = info.value.diagnostics
    assert (diag.code, diag.message, diag.span) == ("SP0601", f"unknown target `{name}`", span)
    assert diag.help.startswith(f"did you mean `{meant}`? ({chip}: ")
    assert diag.help.endswith(f"known targets: {', '.join(T.TARGETS)}")
    assert diag.help.count("did you mean") == 1


@pytest.mark.parametrize(("name", "among", "expected"), [
    ("hopper", None, "did you mean `sm_90a`? (Hopper: H100, H200, GH200) "),
    ("hopper", ("sm_90a", "sm_100a"), "did you mean `sm_90a`? (Hopper: H100, H200, GH200) "),
    ("A100", ("sm_90a", "sm_100a"), ""),  # sm_80 is not among them; by spelling it came close to sm_100a
    ("sm_100b", ("sm_90a", "sm_100a"), "did you mean `sm_100a`? "),
    ("foo", None, ""), (90, None, ""),
])
def test_target_suggestion_is_the_help_of_every_unknown_target(name, among, expected):
    """The one function warm_up (SP0923) and sparse_matmul (SP0804) start their help with, as SP0601 does."""
    assert T.target_suggestion(name, among) == expected
    if among is None and isinstance(name, str):
        with pytest.raises(CompileError) as info:
            T.get_target(name)
        assert info.value.diagnostics[0].help == f"{expected}known targets: {', '.join(T.TARGETS)}"


def test_the_sm_spellings_of_a_gpu_are_its_targets():
    """``sm90``, ``sm_90``, ``sm100`` are targets (the plain ones, not SP0601); where a kernel needs the
    arch-specific features, SP0602 names the `a` target."""
    assert [T.get_target(n).name for n in ("sm90", "sm_90", "sm100", "SM_90A")] == ["sm_90", "sm_90", "sm_100",
                                                                                      "sm_90a"]
    diag = T.feature_problem(T.get_target("sm90"), Feature.WGMMA)
    assert diag is not None and diag.code == "SP0602" and diag.help == "targets that have it: sm_90a"


def test_unknown_target_without_close_match_and_renamed_sm101a():
    with pytest.raises(CompileError) as info:
        T.get_target("volta")
    assert info.value.codes == ["SP0601"]
    assert "did you mean" not in info.value.diagnostics[0].help
    with pytest.raises(CompileError) as info:
        T.get_target("sm_101a")
    assert any("sm_110a" in n for n in info.value.diagnostics[0].notes)
    with pytest.raises(CompileError):
        T.get_target(100)  # type: ignore[arg-type]


def test_default_and_capability_lookup():
    assert T.default_target().name == "sm_90a"
    assert T.target_for_capability(9, 0).name == "sm_90a"
    assert T.target_for_capability(10, 0).name == "sm_100a"
    assert T.target_for_capability(8, 6).name == "sm_86"
    assert T.target_for_capability(12, 1).name == "sm_121a"
    with pytest.raises(CompileError) as info:
        T.target_for_capability(7, 5)
    assert info.value.codes == ["SP0601"]


def test_require_message_and_help():
    target = T.get_target("sm_100f")
    with pytest.raises(CompileError) as info:
        T.require(target, Feature.TCGEN05_I8)
    diag = info.value.diagnostics[0]
    assert diag.code == "SP0602"
    assert diag.message == "`tcgen05.mma` with kind::i8 is not available on sm_100f"
    assert diag.help == "targets that have it: sm_100a, sm_110a"
    assert any("sm_100a" in n for n in diag.notes)  # explains the a/f sibling


def test_require_custom_what_and_success():
    assert T.require(T.get_target("sm_90a"), Feature.WGMMA) is None
    assert T.feature_problem(T.get_target("sm_100a"), Feature.TCGEN05_I8) is None
    diag = T.feature_problem(T.get_target("sm_100a"), Feature.WGMMA, what="`wgmma.mma_async.sp`")
    assert diag is not None
    assert diag.message == "`wgmma.mma_async.sp` is not available on sm_100a"
    assert diag.help == "targets that have it: sm_90a"
    assert diag.notes == ()  # sm_100a has no sibling with wgmma


def test_targets_are_frozen():
    t = T.get_target("sm_90a")
    with pytest.raises(AttributeError):
        t.name = "sm_80"  # type: ignore[misc]
