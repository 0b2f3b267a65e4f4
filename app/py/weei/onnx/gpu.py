"""The WGSL kernels an imported graph trains with on a GPU (docs/gpu.md, "Imported ONNX graphs").

The graph runtime's ``gpuBegin`` emits a device program over the modules
of ``GPU_MODULES``; ``build.py`` packs them into ``kernels.wgsl.json``
beside the runtime (committed, package data), and the importer gives each
package the archive of the modules its own program names, as ``build.py``
does for the built-in models.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources

from ..gpu import pack_archive, parse_archive

__all__ = ["GPU_MODULES", "KERNELS_NAME", "kernels", "gpu_archive"]

#: Every module of wgsl/ a graph's device program may name.
GPU_MODULES = ("matmul.wgsl", "onnx.wgsl", "onnx_conv.wgsl", "optimizer.wgsl", "reduce.wgsl", "softmax_xent.wgsl")
KERNELS_NAME = "kernels.wgsl.json"


def kernels() -> bytes | None:
    """The committed archive of ``GPU_MODULES`` (package data), or None where it is not shipped."""
    path = resources.files(__package__) / KERNELS_NAME
    return path.read_bytes() if path.is_file() else None


def gpu_archive(modules: Iterable[str], source: bytes) -> bytes:
    """The weei-wgsl-archive-v1 of ``modules``, taken from the archive ``source``. Raises GpuError
    (a malformed source) and KeyError (a module it lacks)."""
    held = {m.name: m.source for m in parse_archive(source).modules}
    return pack_archive({name: held[name] for name in sorted(set(modules))})
