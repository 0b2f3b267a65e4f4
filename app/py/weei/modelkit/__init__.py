"""The model kit: compile a C model into a weei-model-package and check it.

``build.py`` builds the repository's own models with it; ``weei model new``,
``weei model build`` and ``weei data chunk`` (docs/models.md) give the same
tools to a model that lives outside the repository.
"""

from __future__ import annotations

from .compile import WASM_FLAGS, BuildError, compile_kernel, compile_wasm, sdk_dir
from .package import ARCHIVE_NAME, INIT_SEED, ModelFacts, gpu_backend, model_manifest, probe_model

__all__ = ["ARCHIVE_NAME", "WASM_FLAGS", "BuildError", "compile_kernel", "compile_wasm", "sdk_dir", "INIT_SEED", "ModelFacts",
           "gpu_backend", "model_manifest", "probe_model"]
