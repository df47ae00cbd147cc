"""Launch arguments: the kernel's parameter kinds, array/scalar conversion, checks and packing.

This module is their public face (``from sparsile.backend.runtime import arguments``); each job
lives in a module of its own, all pure Python (no CUDA calls, so they are unit-tested without a
GPU; the device limits are passed in as data):

====================  ===========================================================================
``codes.py``          the launch diagnostic codes (SP07xx)
``dtypes.py``         the language's element types and the numpy / torch dtypes that hold them
``scalars.py``        scalar arguments: checks and packing
``params.py``         the parameter kinds, :class:`ParamSpec`, binding a call's arguments, the
                      parameter buffer
``arrays.py``         array arguments (numpy, torch, ``__cuda_array_interface__``, DLPack): what
                      they are and the checks they must pass
``launch_config.py``  grid, block, shared memory, cluster, ``pdl`` and ``stream=``
``host_groups.py``    which host arrays share one device copy, at which offset (:func:`plan_host_groups`)
====================  ===========================================================================

:mod:`sparsile.backend.runtime` drives them (``launcher.py``).
"""

from __future__ import annotations

from ...frontend import dlpack
from .arrays import (
    ANY_DEVICE,
    FOREIGN_DEVICE,
    HOST,
    UNKNOWN_DEVICE,
    ArrayInfo,
    check_array_argument,
    describe_array,
    host_view,
    is_c_contiguous,
    is_jax_type,
    is_torch_type,
    read_only_error,
    register_array_type,
    torch_device_pointer,
)
from .codes import (
    ARG_ALIGNMENT,
    ARG_CONTIGUOUS,
    ARG_COUNT,
    ARG_DEVICE,
    ARG_DTYPE,
    ARG_HOST_MEMORY,
    ARG_KEYWORD,
    ARG_KIND,
    ARG_OVERLAP,
    ARG_RANGE,
    ARG_SHAPE,
    BLOCK,
    CLUSTER,
    CONSTEXPR,
    DRIVER,
    GRID,
    KERNEL_NOT_FOUND,
    NO_GPU,
    PDL,
    READ_ONLY,
    SHARED_MEMORY,
    STREAM,
    TENSOR_MAP,
)
from .dtypes import DTYPES, DTypeInfo, array_dtype_matches, dtype_from_numpy, dtype_from_torch, dtype_info, numpy_dtype
from .host_groups import HostEntry, plan_host_groups
from .launch_config import (
    check_cluster,
    check_grid_fits_cluster,
    check_pdl,
    check_shared_memory,
    is_empty_grid,
    normalize_block,
    normalize_grid,
    stream_handle,
)
from .params import (
    MISSING,
    ArgumentBinder,
    ArrayParam,
    ConstexprParam,
    DerivedParam,
    ParamBuffer,
    ParamSpec,
    PointerParam,
    ScalarParam,
    SlotLayout,
    constexpr_equal,
    derived_value,
    is_derived,
    layout_slots,
)
from .scalars import check_divisible, describe_value, encode_scalar, scalar_writer

__all__ = [
    "ANY_DEVICE", "ARG_ALIGNMENT", "ARG_CONTIGUOUS", "ARG_COUNT", "ARG_DEVICE", "ARG_DTYPE", "ARG_HOST_MEMORY",
    "ARG_KEYWORD", "ARG_KIND", "ARG_OVERLAP", "ARG_RANGE", "ARG_SHAPE", "BLOCK", "CLUSTER", "CONSTEXPR", "DRIVER",
    "DTYPES", "FOREIGN_DEVICE", "GRID", "HOST", "KERNEL_NOT_FOUND", "MISSING", "NO_GPU", "PDL", "READ_ONLY",
    "SHARED_MEMORY", "STREAM", "TENSOR_MAP", "UNKNOWN_DEVICE", "ArgumentBinder", "ArrayInfo", "ArrayParam",
    "ConstexprParam", "DTypeInfo", "DerivedParam", "HostEntry", "ParamBuffer", "ParamSpec", "PointerParam",
    "ScalarParam",
    "SlotLayout", "array_dtype_matches", "check_array_argument", "check_cluster", "check_divisible",
    "check_grid_fits_cluster", "check_pdl", "check_shared_memory", "constexpr_equal", "derived_value",
    "describe_array", "describe_value", "dlpack",
    "dtype_from_numpy", "dtype_from_torch", "dtype_info", "encode_scalar", "host_view", "is_c_contiguous",
    "is_derived", "is_empty_grid", "is_jax_type", "is_torch_type", "layout_slots", "normalize_block", "normalize_grid",
    "numpy_dtype", "plan_host_groups", "read_only_error", "register_array_type", "scalar_writer", "stream_handle",
    "torch_device_pointer",
]
