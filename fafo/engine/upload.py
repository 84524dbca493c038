"""A decode step's host values on the device in one copy (:func:`upload`), and a tree's host mask as per-query key
lists (:func:`host_gathered`), computed by numpy: a step's inputs cost one host-to-device copy, and nothing is read
back from the device to size them."""

from __future__ import annotations

import numpy as np
import torch

from fafo.engine.kernels import gather_width
from fafo.engine.torch_compat import modes_active


def upload(values, device: torch.device, dtype=torch.long, pack: bool | None = None):
    """Every host value of ``values`` (ints, lists, ranges, numpy arrays, CPU tensors; ``None`` and device tensors
    pass through) on ``device`` in ONE copy: packed on the host by numpy (no torch op), pinned on CUDA, copied
    without blocking, split into views (bool values, e.g. a tree's mask, come back as bool). Returns a new list,
    or ``values`` itself when nothing had to move.

    ``pack`` (default: on every device but the CPU, and on the CPU under a probe's torch mode, which counts what a
    device runs): on the CPU there is no copy to save, and each value becomes its own array (a copy: the caller
    may reuse its arrays), wrapped without a torch op: about 3 us less per forward than packing and splitting."""
    device = device if isinstance(device, torch.device) else torch.device(device)
    if pack is None:
        pack = device.type != "cpu" or modes_active()
    if not pack:
        return _unpacked(values, device, dtype)
    host, parts, sizes, ints = [], [], [], True  # sizes: each part, then the padding that aligns the next one
    for i, v in enumerate(values):
        if v is None or (isinstance(v, torch.Tensor) and v.device == device):
            continue
        if type(v) is not list or (v and type(v[0]) is not int):  # else a flat list of Python ints
            v, ints = _host_array(v), False
            if v.dtype.kind not in "iub":
                raise TypeError("upload packs integer and bool values only")
        host.append(i)
        parts.append(v)
        n = len(v) if type(v) is list else v.size
        sizes += (n, -n % ALIGN)
    if not host:
        return values
    if ints:  # a decode step's tokens, positions and slots: one conversion (numpy rejects a ragged list)
        packed = []
        for p, pad in zip(parts, sizes[1::2]):
            packed += p
            packed += _ZEROS[:pad]
        packed = np.array(packed, dtype=np.int64)
    else:
        packed, start = np.zeros(sum(sizes), dtype=np.int64), 0
        for p, n, pad in zip(parts, sizes[::2], sizes[1::2]):
            packed[start: start + n] = np.asarray(p).reshape(-1)
            start += n + pad
    flat = torch.from_numpy(packed)
    flat = flat if dtype == torch.long else flat.to(dtype)
    flat = flat.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else flat.to(device)
    views = flat.split_with_sizes(sizes)  # one call for every view
    out = list(values)
    for i, p, view in zip(host, parts, views[::2]):
        if isinstance(p, np.ndarray):
            view = view if p.ndim == 1 else view.view(p.shape)
            view = view.bool() if p.dtype == np.bool_ else view
        out[i] = view
    return out


def _unpacked(values, device: torch.device, dtype) -> list:
    """:func:`upload`'s values as CPU tensors, one numpy array each (the same values, shapes and dtypes)."""
    out = None
    for i, v in enumerate(values):
        if v is None:
            continue
        if type(v) is list and (not v or type(v[0]) is int):  # a flat list of Python ints: the common case first
            array = np.array(v, dtype=np.int64)
        elif isinstance(v, torch.Tensor) and v.device == device:
            continue
        else:
            array = np.array(_host_array(v))  # a copy: the caller's array, or a tensor's memory, may change
            if array.dtype.kind not in "iub":
                raise TypeError("upload packs integer and bool values only")
            array = array if array.dtype == np.bool_ else array.astype(np.int64, copy=False)
        view = torch.from_numpy(array)
        out = list(values) if out is None else out
        out[i] = view if dtype == torch.long or view.dtype == torch.bool else view.to(dtype)
    return values if out is None else out


def host_gathered(mask: np.ndarray, static: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A host ``[Q, Q]`` (or ``[B, Q, Q]``) step mask as per-query key lists ``(index, valid)``, both ``[Q, L]``
    (``[B, Q, L]``): exactly :class:`~fafo.engine.kernels.GatheredMask`'s (L:
    :func:`~fafo.engine.kernels.gather_width`; visible keys first in key order, padding entries point at key 0),
    computed by numpy."""
    counts = mask.sum(axis=-1)
    Q = mask.shape[-1]
    width = gather_width(int(counts.max()), Q, static)
    order = np.argsort(~mask, axis=-1, kind="stable")[..., :width]
    valid = np.arange(width) < counts[..., None]
    return np.where(valid, order, 0), valid


def _host_array(value) -> np.ndarray:
    """A host value as a numpy array without a torch op (a CPU tensor shares its memory)."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex():
            raise TypeError("upload packs integer and bool values only")
        return value.detach().cpu().numpy()
    out = np.asarray(value)
    return out.astype(np.int64) if out.size == 0 else out


ALIGN = 8  # elements: 64 bytes for int64, the alignment inductor's kernels assume of their inputs
_ZEROS = [0] * ALIGN
