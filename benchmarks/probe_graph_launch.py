"""What two kernel launches cost the host, against one CUDA-graph launch of the same two kernels (the
question behind the two-launch eager calls of issue 12: an e4m3 layer's quantizer, then its GEMM).

    python benchmarks/probe_graph_launch.py

Two empty kernels with the parameters of the layer's kernels (a 128-byte tensor map and pointers), on
132 CTAs of 128 threads, launched through libcuda by ctypes (as the native launcher's records are):
one ``cuLaunchKernel``; two; two with programmatic dependent launch on the second
(``cuLaunchKernelEx``); one ``cuGraphLaunch`` of a graph captured from the PDL pair; the same after
``cuGraphExecKernelNodeSetParams`` of one node and of both (what a call at new x / y addresses would
need). Each row: host µs per iteration, N iterations back to back up to the last return, median of
blocks (the GPU drained between blocks). Needs a CUDA GPU (sm_90 or newer) and torch (for the context).
"""

from __future__ import annotations

import argparse
import ctypes as c
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PTX = """
.version 8.0
.target sm_90a
.address_size 64
.visible .entry first(.param .align 64 .b8 tmap[128], .param .u64 x, .param .u64 y, .param .u64 s)
{
  griddepcontrol.launch_dependents;
  ret;
}
.visible .entry second(.param .align 64 .b8 tmap[128], .param .u64 x, .param .u64 y, .param .u64 s)
{
  griddepcontrol.wait;
  ret;
}
"""


class NodeParams(c.Structure):
    """``CUDA_KERNEL_NODE_PARAMS_v2``."""

    _fields_ = [("func", c.c_void_p), ("gridDimX", c.c_uint), ("gridDimY", c.c_uint), ("gridDimZ", c.c_uint),
                ("blockDimX", c.c_uint), ("blockDimY", c.c_uint), ("blockDimZ", c.c_uint),
                ("sharedMemBytes", c.c_uint), ("kernelParams", c.c_void_p), ("extra", c.c_void_p),
                ("kern", c.c_void_p), ("ctx", c.c_void_p)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        print("probe_graph_launch: needs torch with a CUDA GPU (none here); nothing timed")
        return
    from bench_layer_host import host_us  # a sibling script (median of blocks of back-to-back calls)

    from sparsile.backend.runtime.cudalib import LaunchConfig, attribute_list

    torch.cuda.init()
    torch.empty(1, device="cuda")  # the primary context, current on this thread
    cu = c.CDLL("libcuda.so.1")

    def check(code: int, what: str) -> None:
        if code:
            raise SystemExit(f"{what} failed with CUresult {code}")

    module, funcs = c.c_void_p(), {}
    check(cu.cuModuleLoadData(c.byref(module), c.c_char_p(PTX.encode())), "cuModuleLoadData")
    for name in ("first", "second"):
        f = c.c_void_p()
        check(cu.cuModuleGetFunction(c.byref(f), module, name.encode()), "cuModuleGetFunction")
        funcs[name] = f
    stream = c.c_void_p()
    check(cu.cuStreamCreate(c.byref(stream), 1), "cuStreamCreate")  # non-blocking

    tmap = (c.c_ubyte * 128)()
    words = (c.c_uint64 * 3)(0, 0, 0)
    params = (c.c_void_p * 4)(c.addressof(tmap), *(c.addressof(words) + 8 * i for i in range(3)))
    launch = cu.cuLaunchKernel
    launch.argtypes = [c.c_void_p] + [c.c_uint] * 7 + [c.c_void_p] * 3
    launch_ex = cu.cuLaunchKernelEx
    launch_ex.argtypes = [c.POINTER(LaunchConfig), c.c_void_p, c.c_void_p, c.c_void_p]
    config = LaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = 132, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = 128, 1, 1
    attrs = attribute_list((1, 1, 1), True)
    array = (type(attrs[0]) * 1)(*attrs)
    config.attrs, config.numAttrs, config.hStream = c.cast(array, type(config.attrs)), 1, stream.value
    f1, f2, s = funcs["first"].value, funcs["second"].value, stream.value
    p = c.addressof(params)

    def one() -> None:
        launch(f1, 132, 1, 1, 128, 1, 1, 0, s, p, None)

    def two() -> None:
        launch(f1, 132, 1, 1, 128, 1, 1, 0, s, p, None)
        launch(f2, 132, 1, 1, 128, 1, 1, 0, s, p, None)

    def two_pdl() -> None:
        launch(f1, 132, 1, 1, 128, 1, 1, 0, s, p, None)
        launch_ex(c.byref(config), f2, p, None)

    # the PDL pair captured into a graph (thread-local capture: other threads may run on)
    check(cu.cuStreamBeginCapture_v2(stream, 1), "cuStreamBeginCapture")
    two_pdl()
    graph = c.c_void_p()
    check(cu.cuStreamEndCapture(stream, c.byref(graph)), "cuStreamEndCapture")
    graph_exec = c.c_void_p()
    check(cu.cuGraphInstantiateWithFlags(c.byref(graph_exec), graph, c.c_ulonglong(0)), "cuGraphInstantiate")
    count = c.c_size_t(0)
    check(cu.cuGraphGetNodes(graph, None, c.byref(count)), "cuGraphGetNodes")
    nodes = (c.c_void_p * count.value)()
    check(cu.cuGraphGetNodes(graph, nodes, c.byref(count)), "cuGraphGetNodes")
    node_params = []
    for node in nodes:
        np_ = NodeParams()
        check(cu.cuGraphKernelNodeGetParams_v2(c.c_void_p(node), c.byref(np_)), "cuGraphKernelNodeGetParams")
        np_.kernelParams = p
        np_.extra = None
        node_params.append((c.c_void_p(node), np_))
    graph_launch = cu.cuGraphLaunch
    graph_launch.argtypes = [c.c_void_p, c.c_void_p]
    set_params = cu.cuGraphExecKernelNodeSetParams_v2
    set_params.argtypes = [c.c_void_p, c.c_void_p, c.POINTER(NodeParams)]
    ge = graph_exec.value
    (n1, np1), (n2, np2) = node_params[0], node_params[-1]
    check(set_params(ge, n1, c.byref(np1)), "cuGraphExecKernelNodeSetParams")

    def graph_only() -> None:
        graph_launch(ge, s)

    def graph_set1() -> None:
        set_params(ge, n2, c.byref(np2))
        graph_launch(ge, s)

    def graph_set2() -> None:
        set_params(ge, n1, c.byref(np1))
        set_params(ge, n2, c.byref(np2))
        graph_launch(ge, s)

    def sync() -> None:
        check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")

    print(f"gpu {torch.cuda.get_device_name()}, graph nodes {count.value}; host µs per iteration "
          f"({args.calls} back to back, median of 7 blocks)")
    print("| what | µs |\n|---|---|")
    for name, fn in (("cuLaunchKernel x1", one), ("cuLaunchKernel x2", two), ("cuLaunchKernel + cuLaunchKernelEx (PDL)",
                     two_pdl), ("cuGraphLaunch (the PDL pair)", graph_only),
                     ("SetParams (1 node) + cuGraphLaunch", graph_set1),
                     ("SetParams (2 nodes) + cuGraphLaunch", graph_set2),
                     ("cuLaunchKernel x1 (again)", one), ("cuLaunchKernel + cuLaunchKernelEx (again)", two_pdl),
                     ("cuGraphLaunch (again)", graph_only)):
        print(f"| {name} | {host_us(fn, sync, args.calls):.2f} |")


if __name__ == "__main__":
    main()
