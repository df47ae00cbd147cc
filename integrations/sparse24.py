"""The compressed-tensors ``sparse-24-bitmask`` layout of one 2:4 weight, in numpy.

A weight W (out, in) is stored as three tensors (compressed-tensors' ``Sparse24BitMaskTensor``):

* ``compressed`` (out, in/2): the kept elements of each row in order, in the weight's dtype (fp8 as
  F8_E4M3; files sparsile wrote before hold its int8 bit pattern);
* ``bitmask`` uint8 (out, ceil(in/8)): which elements were kept, ``numpy.packbits(mask, axis=1,
  bitorder="little")`` of the boolean (out, in) mask;
* ``shape`` int64 [out, in], stored (2, 1) (``torch.tensor(shape).reshape(-1, 1)``).

Decompression scatters the flattened ``compressed`` into the positions of the mask in row-major
order (the format's own rule), so a reader needs neither exactly two bits per group nor nonzero kept
values: a writer that ranks by magnitude keeps two elements of an all-zero group, and -0.0 may be
kept or dropped. Nor does it need the 2:4 groups along rows: a transformers Conv1D's weight W is
stored (in, out), its groups down the columns (:func:`conv1d_bitmask_layout`). This module
converts between that layout and the sparsity toolkit's (values, logical indices) of
docs/sparse-metadata.md, and reads a checkpoint folder's config.json and file list; errors are
SP0912, SP0913, SP0915 (docs/diagnostics.md).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from .errors import SP_CHECKPOINT_CONFIG, SP_CHECKPOINT_LAYER, SP_CHECKPOINT_WRITE, IntegrationError

GROUP = 4  # 2:4: two of every four consecutive elements along a row
FORMAT = "sparse-24-bitmask"
CONFIG = "config.json"
INDEX = "model.safetensors.index.json"


def _layer_error(name: str, message: str, help: str) -> IntegrationError:
    return IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: {message}", help=help)


def checked_shape(shape: Any, name: str) -> tuple[int, int]:
    """The (out, in) of a ``.shape`` tensor: two non-negative integers, (2,) as this module writes
    it, or (2, 1) as compressed-tensors writes it (``torch.tensor(shape).reshape(-1, 1)``; its reader
    flattens it), or (1, 2)."""
    array = np.asarray(shape)
    if array.shape not in ((2,), (2, 1), (1, 2)) or array.dtype.kind not in "iu" or (array < 0).any():
        raise _layer_error(name, f"shape must hold two non-negative integers [out, in], got {array.tolist()!r}",
                           help="write .shape as an int64 tensor [out_features, in_features]")
    out, cols = array.reshape(-1)
    return int(out), int(cols)


def mask_from_bitmask(bitmask: Any, shape: tuple[int, int], name: str, columns: bool = False) -> np.ndarray:
    """The boolean (rows, cols) mask of a packed ``bitmask``, with at most two elements kept per group
    of four along each row, or with ``columns`` down each column (a transformers Conv1D's weight
    (in, out): :func:`conv1d_bitmask_layout`)."""
    rows, cols = shape
    bits = np.asarray(bitmask)
    want = (rows, -(-cols // 8))
    if bits.dtype != np.uint8 or bits.shape != want:
        raise _layer_error(name, f"bitmask must be uint8 of shape {want}, got {bits.dtype} {bits.shape}",
                           help="pack the mask with numpy.packbits(mask, axis=1, bitorder='little')")
    mask = np.unpackbits(bits, axis=1, bitorder="little").astype(bool)
    if mask[:, cols:].any():  # (packbits leaves them zero: the mask was packed for a wider weight)
        row = int(np.argwhere(mask[:, cols:])[0][0])
        raise _layer_error(name, f"the bitmask keeps elements beyond column {cols} (row {row}); the .shape "
                           f"[{rows}, {cols}] is narrower than the weight it was packed from",
                           help="write .shape as the weight's [out_features, in_features]")
    mask = mask[:, :cols]
    _check_groups(mask.T if columns else mask, name, columns)
    return mask


def _check_groups(mask: np.ndarray, name: str, columns: bool) -> None:
    """SP0913 where a line of ``mask`` (a row, or with ``columns`` a column given as a row of the
    transposed mask) keeps more than two elements of a group of four."""
    lines, length = mask.shape
    groups = -(-length // GROUP)
    padded = np.zeros((lines, groups * GROUP), dtype=bool)
    padded[:, :length] = mask
    counts = padded.reshape(lines, groups, GROUP).sum(axis=2)  # (not -1: ambiguous for 0 lines)
    if (counts > 2).any():
        line, group = (int(i) for i in np.argwhere(counts > 2)[0])
        what, across = ("column", "rows") if columns else ("row", "columns")
        help = ("the checkpoint is not 2:4 sparse along this transformers Conv1D layer's inputs (its weight is "
                "stored (in, out): groups of four rows down each column); prune it to 2:4 before loading"
                if columns else "the checkpoint is not 2:4 sparse; prune it to 2:4 before loading")
        raise _layer_error(name, f"the bitmask keeps {int(counts[line, group])} elements of {what} {line}, group "
                           f"{group} ({across} {GROUP * group}..{GROUP * group + 3}); 2:4 keeps at most 2", help=help)


def dense_from_bitmask(compressed: Any, bitmask: Any, shape: Any, name: str = "?", columns: bool = False
                       ) -> np.ndarray:
    """The dense weight of the stored shape in ``compressed``'s dtype: the compressed values scattered,
    in row-major order, into the positions the bitmask keeps (zeros elsewhere). ``columns``: the weight
    of a transformers Conv1D, (in, out), whose 2:4 groups run down its columns, so that a row of
    ``compressed`` need not hold one row's values (only their total is checked)."""
    rows, cols = checked_shape(shape, name)
    mask = mask_from_bitmask(bitmask, (rows, cols), name, columns)
    values = np.asarray(compressed)
    if values.ndim != 2 or values.shape[0] != rows:
        raise _layer_error(name, f"compressed must be 2-D with {rows} rows, got shape {values.shape}",
                           help="write compressed as (out_features, in_features / 2)" if not columns else
                           "write compressed as (in_features, out_features / 2), the kept values in row-major order")
    kept = int(mask.sum())
    if kept != values.size:
        raise _layer_error(name, f"the bitmask keeps {kept} elements but compressed holds {values.size}",
                           help="write exactly one compressed value per set bit of the bitmask")
    per_row = mask.sum(axis=1)
    if not columns and (per_row != values.shape[1]).any():  # (the flattened scatter would move values across rows)
        row = int(np.argwhere(per_row != values.shape[1])[0][0])
        raise _layer_error(name, f"the bitmask keeps {int(per_row[row])} elements of row {row} but compressed holds "
                           f"{values.shape[1]} per row", help="write each row's kept values in its row of compressed")
    dense = np.zeros((rows, cols), dtype=values.dtype)
    dense[mask] = values.reshape(-1)
    return dense


def bitmask_layout(values: np.ndarray, indices: np.ndarray, k: int, name: str = "?"
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(compressed, bitmask, shape) of a weight given as the toolkit's ``values`` (out, k/2) and
    logical ``indices`` (out, k/4, 2): each group keeps exactly the two elements its indices name,
    so ``compressed`` is ``values`` itself (kept elements in index order)."""
    rows = values.shape[0]
    if k % GROUP:
        raise IntegrationError(SP_CHECKPOINT_WRITE,
                               f"layer {name}: in_features = {k} is not a multiple of {GROUP}; sparse-24-bitmask "
                               "stores whole groups of 4",
                               help="write this layer's weight dense (a plain .weight), not as sparse-24-bitmask")
    bitmask = np.packbits(_kept_mask(indices, k), axis=1, bitorder="little")
    return np.ascontiguousarray(values[:, :k // 2]), bitmask, np.array([rows, k], dtype=np.int64)


def _kept_mask(indices: np.ndarray, k: int) -> np.ndarray:
    """The (rows, k) mask of the elements the toolkit's logical ``indices`` (rows, k/4, 2) keep."""
    rows = indices.shape[0]
    mask = np.zeros((rows, k // GROUP, GROUP), dtype=bool)
    row_ix = np.arange(rows)[:, None]
    group_ix = np.arange(k // GROUP)[None, :]
    for slot in range(indices.shape[2]):
        mask[row_ix, group_ix, indices[:, :, slot]] = True
    return mask.reshape(rows, k)


def conv1d_bitmask_layout(values: np.ndarray, indices: np.ndarray, k: int, name: str = "?"
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(compressed, bitmask, shape) of a transformers Conv1D's weight W (in, out) = (k, n), in its own
    layout, given the toolkit's ``values`` (n, k/2) and logical ``indices`` (n, k/4, 2) of W.T (the
    layer's): the format of W itself, whose 2:4 groups run down its columns (four consecutive inputs
    of an output). ``compressed`` (k, n/2) holds W's kept elements in row-major order; a row of it is
    not a row of W (their counts vary), which the format's decompression (the flattened values
    scattered in row-major order) does not need. ``bitmask`` (k, ceil(n/8)), ``shape`` [k, n]."""
    n = values.shape[0]
    if k % GROUP or n % 2:
        what = f"in_features = {k} is not a multiple of {GROUP}" if k % GROUP else f"out_features = {n} is odd"
        raise IntegrationError(SP_CHECKPOINT_WRITE,
                               f"layer {name}: {what}; a transformers Conv1D's sparse layer is stored (in, out) with "
                               "whole groups of 4 down its columns and compressed values (in, out / 2)",
                               help="write this layer's weight dense (a plain .weight), not as sparse-24-bitmask")
    mask = _kept_mask(indices, k)
    dense = np.zeros((n, k), dtype=values.dtype)
    dense[mask] = values[:, :k // 2].reshape(-1)  # (row-major: group g's kept pair is values[:, 2g:2g + 2])
    mask_w = np.ascontiguousarray(mask.T)
    compressed = dense.T[mask_w].reshape(k, n // 2)
    bitmask = np.packbits(mask_w, axis=1, bitorder="little")
    return compressed, bitmask, np.array([k, n], dtype=np.int64)


# ------------------------------------------------------------------------------------------------
# a checkpoint folder: config.json and the safetensors files


def _config_error(message: str, help: str) -> IntegrationError:
    return IntegrationError(SP_CHECKPOINT_CONFIG, message, help=help)


def sparsity_config(config: dict[str, Any]) -> dict[str, Any] | None:
    """The ``sparsity_config`` of a config.json (top level, quantization_config or compression_config)."""
    for holder in (config, config.get("quantization_config") or {}, config.get("compression_config") or {}):
        if isinstance(holder, dict) and isinstance(holder.get("sparsity_config"), dict):
            return holder["sparsity_config"]
    return None


def _scheme_holders(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Where compressed-tensors keeps a quantization scheme (``config_groups`` and ``ignore``) in a
    config.json: the top level, quantization_config / compression_config, or a quantization_config
    inside the latter."""
    holders = [config]
    for key in ("quantization_config", "compression_config"):
        inner = config.get(key)
        if isinstance(inner, dict):
            holders += [inner, inner.get("quantization_config")]
    return [h for h in holders if isinstance(h, dict) and isinstance(h.get("config_groups"), dict)]


def declared_weight_types(config: dict[str, Any]) -> set[str]:
    """The weight types (``"int"``, ``"float"``) that a config.json's quantization scheme declares:
    ``config_groups[*].weights.type``, where compressed-tensors keeps them (under quantization_config
    or compression_config, next to the sparsity_config or in a quantization_config of its own).
    An int-quantized weight and an fp8 one written as int8 bits are both int8 arrays; this tells them
    apart."""
    types = set()
    for holder in _scheme_holders(config):
        for group in holder["config_groups"].values():
            weights = group.get("weights") if isinstance(group, dict) else None
            if isinstance(weights, dict) and isinstance(weights.get("type"), str):
                types.add(weights["type"])
    return types


# the class names nn.Linear's MRO holds (compressed-tensors matches a class target against each)
LINEAR_CLASSES = ("Linear", "Module")


def target_names_module(target: Any, name: str) -> bool:
    """Whether a compressed-tensors ``target`` names the module ``name``: the name itself, or a
    ``re:`` pattern that ``re.match`` finds at its start (not ``fullmatch`` or ``search``); a pattern
    that does not compile names nothing."""
    if not isinstance(target, str):
        return False
    if target.startswith("re:"):
        try:
            return re.match(target[3:], name) is not None
        except re.error:
            return False
    return target == name


def _matches(target: Any, name: str, classes: tuple[str, ...]) -> bool:
    """Whether ``target`` names the module ``name`` or one of its classes ``classes``."""
    return target_names_module(target, name) or (isinstance(target, str) and target in classes)


def scheme_group(config: dict[str, Any], name: str, classes: tuple[str, ...] = LINEAR_CLASSES
                 ) -> tuple[str, dict[str, Any]] | None:
    """(name, scheme) of the config group that compressed-tensors applies to the module ``name`` (of
    the classes ``classes``: nn.Linear's by default), or None where no group targets it or the
    scheme's ``ignore`` names it (a name, a ``re:`` pattern or a class). As compressed-tensors: each
    target belongs to the last group listing it; the targets are ordered those without ``re:`` first,
    each kind by its string; the first that names the module (its name, a ``re:`` pattern) wins, else
    the first that is one of its classes."""
    for holder in _scheme_holders(config):
        ignore = holder.get("ignore") if isinstance(holder.get("ignore"), list) else []
        if any(_matches(t, name, classes) for t in ignore):
            continue
        owner: dict[str, str] = {}  # target -> the last group that lists it
        for group_name, group in holder["config_groups"].items():
            targets = group.get("targets") if isinstance(group, dict) else None
            for target in targets if isinstance(targets, list) else ():
                if isinstance(target, str):
                    owner[target] = group_name
        ordered = sorted(owner, key=lambda t: ("re:" in t, t))
        found = next((t for t in ordered if target_names_module(t, name)), None)
        if found is None:
            found = next((t for t in ordered if t in classes), None)
        if found is not None:
            return owner[found], holder["config_groups"][owner[found]]
    return None


def static_input_group(config: dict[str, Any], name: str, classes: tuple[str, ...] = LINEAR_CLASSES
                       ) -> tuple[str, bool] | None:
    """(group name, whether it says ``dynamic``) where the config group compressed-tensors applies to
    the linear module ``name`` (:func:`scheme_group`) declares static input activations, else None.
    Static is ``input_activations`` with ``dynamic: false`` or none at all (compressed-tensors'
    default is false)."""
    found = scheme_group(config, name, classes)
    if found is None:
        return None
    group_name, group = found
    inputs = group.get("input_activations")
    if not isinstance(inputs, dict) or inputs.get("dynamic", False) is not False:
        return None
    return str(group_name), "dynamic" in inputs


def dynamic_input_group(config: dict[str, Any], name: str, classes: tuple[str, ...] = LINEAR_CLASSES) -> str | None:
    """The name of the config group compressed-tensors applies to the linear module ``name``
    (:func:`scheme_group`) where it declares dynamic input activations (``dynamic`` true, or
    ``"local"``: x's scales computed at run time, none stored), else None."""
    found = scheme_group(config, name, classes)
    if found is None:
        return None
    group_name, group = found
    inputs = group.get("input_activations")
    return str(group_name) if isinstance(inputs, dict) and inputs.get("dynamic", False) is not False else None


def weight_only_group(config: dict[str, Any], name: str, classes: tuple[str, ...] = LINEAR_CLASSES) -> str | None:
    """The name of the config group compressed-tensors applies to the linear module ``name``
    (:func:`scheme_group`) where it quantizes the weights only (``weights`` and no
    ``input_activations``: W8A16, x left as it is), else None."""
    found = scheme_group(config, name, classes)
    if found is None:
        return None
    group_name, group = found
    return str(group_name) if isinstance(group.get("weights"), dict) and group.get("input_activations") is None \
        else None


def asymmetric_group(config: dict[str, Any], name: str, classes: tuple[str, ...] = LINEAR_CLASSES
                     ) -> tuple[str, str] | None:
    """(group name, ``"weights"`` or ``"input_activations"``) where the config group compressed-tensors
    applies to the linear module ``name`` (:func:`scheme_group`) declares that quantization
    asymmetric (``symmetric: false``: values ``(q - zero_point) * scale``), else None.
    compressed-tensors' default is symmetric (true)."""
    found = scheme_group(config, name, classes)
    if found is None:
        return None
    group_name, group = found
    for part in ("weights", "input_activations"):
        args = group.get(part)
        if isinstance(args, dict) and args.get("symmetric", True) is False:
            return str(group_name), part
    return None


def read_config(path: str | Path) -> dict[str, Any]:
    """config.json of checkpoint folder ``path``, checked to declare the sparse-24-bitmask format."""
    path = Path(path)
    file = path / CONFIG
    try:
        config = json.loads(file.read_text())
    except FileNotFoundError:
        raise _config_error(f"{path} has no {CONFIG}", help="pass the checkpoint's folder") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _config_error(f"{file} cannot be read as JSON: {exc}", help="repair or rewrite config.json") from exc
    found = sparsity_config(config) if isinstance(config, dict) else None
    if found is None or found.get("format") != FORMAT:
        got = "no sparsity_config" if found is None else f"format {found.get('format')!r}"
        raise _config_error(f"{file} declares {got}, not {FORMAT!r}",
                            help="this loader reads compressed-tensors sparse-24-bitmask checkpoints only")
    return config


def index_map(path: Path) -> dict[str, str] | None:
    """The ``weight_map`` (tensor name -> file name) of checkpoint folder ``path``'s shard index, or
    None where the folder has no index; SP0912 for an index without a readable one, or naming a file
    outside the folder."""
    index = path / INDEX
    if not index.exists():
        return None
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (OSError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise _config_error(f"{index} has no readable weight_map ({exc})", help="rewrite the index") from exc
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise _config_error(f"{index} has no readable weight_map (not an object of tensor names to file names)",
                            help="rewrite the index")
    root = path.resolve()
    outside = sorted(name for name in set(weight_map.values()) if not (root / name).resolve().is_relative_to(root))
    if outside:
        raise _config_error(f"{index} names {outside[0]!r}, which lies outside the checkpoint folder"
                            + (f" ({len(outside) - 1} more such)" if len(outside) > 1 else ""),
                            help="name each shard by its file name in the folder (a checkpoint reads only "
                            "its own files)")
    return weight_map


def shards(path: Path) -> list[Path]:
    """The safetensors files of checkpoint folder ``path`` (those its index names, else all)."""
    weight_map = index_map(path)
    if weight_map is not None:
        root = path.resolve()
        named = {(root / name).resolve(): path / name for name in sorted(set(weight_map.values()), reverse=True)}
        files = sorted(named.values())  # "a.safetensors" and "./a.safetensors" are one file, read once
        missing = [str(f.relative_to(path)) for f in files if not f.is_file()]
        if missing:
            raise _config_error(f"{path / INDEX} names {missing[0]!r}, which is not a file of the folder"
                                + (f" ({len(missing) - 1} more such)" if len(missing) > 1 else ""),
                                help="copy every shard the index names into the folder, or rewrite the index")
        return files
    files = sorted(f for f in path.glob("*.safetensors") if f.is_file())
    if not files:
        raise _config_error(f"{path} holds no .safetensors file", help="write the weights to model.safetensors")
    return files


def check_index(path: Path, held: dict[str, Path]) -> None:
    """SP0912 where the shard index of checkpoint folder ``path`` is stale: it places a tensor in a
    file that does not hold it (``held``: tensor name -> the file read that holds it). Before, such a
    tensor was only missing (``strict=False`` loaded without it: the model kept its own values), or
    loaded from another file than the index names."""
    weight_map = index_map(path)
    if weight_map is None:
        return
    root = path.resolve()
    stale = sorted(key for key, name in weight_map.items()
                   if key not in held or held[key].resolve() != (root / name).resolve())
    if not stale:
        return
    key = stale[0]
    more = f" ({len(stale) - 1} more such)" if len(stale) > 1 else ""
    where = f"; {held[key].name} does" if key in held else "; no file it names does"
    raise _config_error(f"{path / INDEX} places tensor {key!r} in {weight_map[key]}, which does not hold it{where}"
                        + more, help="the index and the shards are of different checkpoints: write the checkpoint "
                        "again, or rewrite the index from the shards' tensors")
