"""The immutable description of a training job, as prepared and checked.

A ``JobSpec`` is what the coordinator state machine starts from: the model
(its info and module descriptor), the settings, the chunks that passed their
size/hash/format checks, the auxiliary weights files and whether a
validation file exists. Everything in it has been validated already.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..wire.messages import ArtifactRef, check_gpu_offer
from ..formats.modelinfo import ModelInfo
from ..formats.settings import TrainingSettings

__all__ = ["ChunkInfo", "ModuleInfo", "GpuOffer", "JobSpec"]


@dataclass(frozen=True)
class ChunkInfo:
    """One dataset chunk: its manifest entry, with the example count the model confirmed."""

    id: str
    file_name: str
    bytes: int
    sha256: str
    format: str
    example_count: int

    @property
    def ref(self) -> ArtifactRef:
        return ArtifactRef("chunk", self.sha256, self.bytes)


@dataclass(frozen=True)
class ModuleInfo:
    """The model module descriptor recorded in checkpoints (spec: CheckpointMetadata.module)."""

    file_name: str
    bytes: int
    sha256: str

    @property
    def ref(self) -> ArtifactRef:
        return ArtifactRef("module", self.sha256, self.bytes)

    def to_json(self) -> dict[str, Any]:
        return {"artifactId": f"module-{self.sha256[:16]}", "fileName": self.file_name,
                "bytes": self.bytes, "sha256": self.sha256}

    def descriptor(self) -> dict[str, Any]:
        """The module as an invitation and the job view describe it."""
        return {"fileName": self.file_name, "bytes": self.bytes, "sha256": self.sha256}


@dataclass(frozen=True)
class GpuOffer:
    """A job created with executionFiles: its WGSL archive and the package's GPU backend (docs/gpu.md).

    The coordinator announces it in Deliver (``to_json``, checked by
    ``messages.check_gpu_offer``) and keeps it in the job record, so the
    archive is named, stored once by SHA-256 and deleted with the job."""

    archive: ModuleInfo  # the shaderArchive: fileName, bytes, sha256
    backend: dict[str, Any]  # id, estimatedWorkingBytes, numericalMode, requiredFeatures, minimumDeviceLimits
    cpu_backend: str | None = None  # the package's CPU backend id (execution.backend on the CPU)

    @property
    def ref(self) -> ArtifactRef:
        return ArtifactRef("wgsl", self.archive.sha256, self.archive.bytes)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"shaderArchive": self.archive.descriptor(), "backend": dict(self.backend)}
        if self.cpu_backend is not None:
            out["cpuBackend"] = self.cpu_backend
        return out

    @classmethod
    def from_json(cls, obj: Any) -> GpuOffer:
        """From a record or a message; raises MessageError naming the bad field."""
        checked = check_gpu_offer(obj)
        a = checked["shaderArchive"]
        return cls(ModuleInfo(a["fileName"], a["bytes"], a["sha256"]), checked["backend"], checked.get("cpuBackend"))


@dataclass(frozen=True)
class JobSpec:
    """A checked job: what the coordinator needs to run it."""

    job_id: str
    info: ModelInfo
    module: ModuleInfo
    settings: TrainingSettings
    weight_bytes: int
    chunks: tuple[ChunkInfo, ...] = ()
    auxiliary_files: dict[str, ArtifactRef] = field(default_factory=dict)  # slot id -> file
    has_validation: bool = False
    validation_format: str | None = None
    gpu: GpuOffer | None = None  # executionFiles were selected
    working_bytes: int | None = None  # the CPU backend's estimatedWorkingBytes (weei.runtime.sandbox); None: unknown
    cpu_backend: str | None = None  # the package's CPU backend id (participants' execution.backend on the CPU)

    @property
    def is_experience(self) -> bool:
        return bool(self.info.is_experience)

    # chunk() runs for every hand-out and every update: an index, not a scan (1,000 peers, issue 11 P6).
    _chunk_index: dict[str, ChunkInfo] = field(init=False, repr=False, compare=False)
    # And data_bytes for every invitation: the chunks' sum once, not a sum over the chunks per peer.
    _chunk_bytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_chunk_index", {c.id: c for c in reversed(self.chunks)})  # the first of an id wins
        object.__setattr__(self, "_chunk_bytes", sum(c.bytes for c in self.chunks))

    def chunk(self, chunk_id: str) -> ChunkInfo:
        return self._chunk_index[chunk_id]

    @property
    def data_bytes(self) -> int:
        """What a participant downloads besides the module: the chunks and the auxiliary files."""
        return self._chunk_bytes + sum(r.bytes for r in self.auxiliary_files.values())

    def with_settings(self, settings: TrainingSettings) -> JobSpec:
        return replace(self, settings=settings)
