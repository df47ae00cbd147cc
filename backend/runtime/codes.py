"""The launch diagnostic codes, raised as :class:`~sparsile.frontend.diagnostics.LaunchError`
(each is registered in ``frontend/codes.py`` and documented in ``docs/diagnostics.md``; SP0722 to
SP0724 are raised before the runtime, by the front end and the driver):

======  ===================================================================
SP0701  wrong number of arguments (missing or too many)
SP0702  unknown keyword argument, or a value given twice
SP0703  pointer argument of the wrong dtype (or a dtype the language lacks)
SP0704  pointer not 16-byte aligned although the kernel was specialized for it
SP0705  non-contiguous array where contiguity is required
SP0706  host memory where device memory is required
SP0707  array on another device (or a non-CUDA device)
SP0708  argument of an unsupported kind (not an array / not a number)
SP0709  scalar out of range for its type, or violating a specialization (divisibility)
SP0710  grid: negative, non-integer, not 1 to 3 dimensions, or beyond the device limits (0 is an
        empty launch, no error)
SP0711  block: more threads than the device or the compiled kernel allows
SP0712  shared memory beyond the device's opt-in limit
SP0713  cluster dimensions invalid for the device or the grid
SP0714  tensor-map description violates a TMA rule (``tensormap.py``)
SP0715  a CUDA driver call failed (``runtime.CudaError``)
SP0716  no usable GPU / CUDA driver
SP0717  invalid ``stream=`` argument
SP0718  constexpr argument differs from the value the kernel was compiled for
SP0719  read-only array passed to a parameter the kernel writes
SP0720  array rank/shape does not match what the kernel parameter needs
SP0721  kernel name not found in the loaded module
SP0722  parameter annotation the launcher cannot pass (``frontend/sema/specialize.py``)
SP0723  constexpr argument of a kind that cannot be a compile-time constant
SP0724  malformed ahead-of-time signature (``name=type`` / ``name=value`` items)
SP0726  ``pdl=True`` (programmatic dependent launch) on a device below compute capability 9.0
SP0750  host arrays that overlap without being the same view, one of them written, where one is
        copied by its values (strided, byte-swapped, converted: copies would hide the writes from
        each other); C-contiguous native-order ones share one copy (host_groups.py)
SP0751  a torch tensor with its negative (or conjugate) bit set, read by pointer
SP0752  ``synchronize()`` while a CUDA graph is captured on the device (it would invalidate the capture)
======  ===================================================================
"""

from ...target.tma_layout import TENSOR_MAP as TMA_LAYOUT_CODE

ARG_COUNT = "SP0701"
ARG_KEYWORD = "SP0702"
ARG_DTYPE = "SP0703"
ARG_ALIGNMENT = "SP0704"
ARG_CONTIGUOUS = "SP0705"
ARG_HOST_MEMORY = "SP0706"
ARG_DEVICE = "SP0707"
ARG_KIND = "SP0708"
ARG_RANGE = "SP0709"
GRID = "SP0710"
BLOCK = "SP0711"
SHARED_MEMORY = "SP0712"
CLUSTER = "SP0713"
TENSOR_MAP = TMA_LAYOUT_CODE  # the interpreter raises it too, at a TMA copy (target/tma_layout.py)
DRIVER = "SP0715"
NO_GPU = "SP0716"
STREAM = "SP0717"
CONSTEXPR = "SP0718"
READ_ONLY = "SP0719"
ARG_SHAPE = "SP0720"
KERNEL_NOT_FOUND = "SP0721"
PDL = "SP0726"
ARG_OVERLAP = "SP0750"
ARG_NEGATED = "SP0751"
CAPTURE_SYNC = "SP0752"
