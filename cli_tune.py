"""``sparsile tune``: the shapes (given or read from files) and the table path checked, then the
sparse GEMM (or, with ``--linear``, the torch layer's kernels) tuned on the GPU (docs/autotune.md)."""

from __future__ import annotations

import argparse
import functools
import re
from typing import TextIO

from .cli_common import EXIT_OK, EXIT_UNAVAILABLE
from .cli_common import Usage as _Usage

FILE_SUFFIX = re.compile(r"\.[A-Za-z][A-Za-z0-9_]*$")
"""A file name's suffix (``.txt``, ``.shapes``): an argument with one is a file of shapes, not a shape."""


def _tune_shapes(items: list[str]) -> list[str]:
    """The shapes of ``sparsile tune``: each item a shape or a file of shapes (one per line, ``#``
    comments)."""
    import os

    shapes: list[str] = []
    for item in items:
        if os.path.isfile(item):
            try:
                with open(item, encoding="utf-8") as f:
                    lines = f.read().splitlines()
            except (OSError, UnicodeDecodeError) as e:
                raise _Usage(f"cannot read `{item}`: {getattr(e, 'strerror', None) or e}") from None
            shapes += [ln.split("#", 1)[0].strip() for ln in lines if ln.split("#", 1)[0].strip()]
        elif os.path.isdir(item):
            raise _Usage(f"`{item}` is a folder: give shapes (MxNxK) or files of shapes")
        elif os.sep in item or "/" in item or FILE_SUFFIX.search(item):  # a path (a folder or a suffix, `.txt`)
            raise _Usage(f"cannot read `{item}`: no such file (and it is no MxNxK shape)")
        else:
            shapes.append(item)
    if not shapes:
        raise _Usage(f"no shapes to tune: {', '.join(f'`{i}`' for i in items)} holds none (one MxNxK shape a line)")
    return shapes


def _check_table_path(path: str) -> None:
    """A usage error for a ``tune -o`` path the table cannot be written to, before the tuning (it
    used to be an OSError traceback once every shape was timed). The table's folders are made as
    needed (write_json_atomic), so the nearest existing one must be a writable folder."""
    import os
    import tempfile

    if os.path.isdir(path):
        raise _Usage(f"cannot write `{path}`: it is a folder (give the table's file name)")
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        raise _Usage(f"cannot write `{path}`: `{folder}` is a file, not a folder")
    try:  # a trial file, as the table is written (a temporary file beside it, then renamed)
        fd, trial = tempfile.mkstemp(prefix=".sparsile-tune.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise _Usage(f"cannot write `{path}`: {e.strerror} (in `{folder}`)") from None
    os.close(fd)
    os.unlink(trial)


def tune_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``sparsile tune SHAPES...``: every argument checked before the first shape is timed."""
    from .backend import runtime
    from .stdlib.kernels.tuning import config_space, parse_shape, tune_sparse_matmul

    shapes = [parse_shape(s) for s in _tune_shapes(args.shapes)]  # LaunchError SP0778: exit status 2
    if args.linear and args.inflight:
        raise _Usage("--inflight applies to sparse_matmul's kernels; the torch layer's (--linear) keep every MMA "
                     "group waited for")
    if args.output is not None:
        _check_table_path(args.output)
    if not runtime.has_gpu():
        print("error[SP0731]: sparsile tune times kernels on the GPU: no NVIDIA GPU is available\n"
              " = help: run it on a machine with the GPU the table is for; nothing needs a table to run: "
              "shapes no table lists use the planner's heuristics, and stdlib/kernels/tuned/ ships the H200's "
              "(docs/autotune.md)",
              file=err)
        return EXIT_UNAVAILABLE
    device = getattr(args, "device", None)  # --device N, else sparsile's current device (stdlib/kernels/tune_device.py)
    if device is not None:
        from .stdlib.kernels.tune_device import tuning_ordinal

        tuning_ordinal(device)  # SP0716 for a GPU that is not there, before the first shape is timed
    if args.linear:
        from .stdlib.kernels.linear_tuning import tune_sparse_linear

        table = tune_sparse_linear(shapes, dtypes=args.dtype or ("bf16",), warmup=args.warmup, rep=args.rep,
                                   out=args.output, stderr=err, progress=True, device=device)
    else:
        space = functools.partial(config_space, inflight=True) if args.inflight else config_space
        table = tune_sparse_matmul(shapes, dtypes=args.dtype or ("bf16", "f16"), warmup=args.warmup,
                                   rep=args.rep, out=args.output, stderr=err, progress=True, space=space,
                                   device=device)
    for name, entry in table["entries"].items():
        print(f"{name}: {entry['config']} {entry['us']} us (default {entry['default_us']} us)", file=out)
    return EXIT_OK
