"""Try a checkpoint: what the trained model says about one input (issue 24, item 14).

Weei WASM ABI 1 has no inference operation; every model has ``evaluate``,
which returns the mean loss over a data file (docs/abi.md, "Trying a
model"). For the two reference data formats that loss is a cross-entropy,
so ``evaluate`` of a file of ONE record whose target is a candidate gives
that candidate's probability exactly: ``p = exp(-loss)``:

* ``weei-digits-v1`` (an 8×8 image and its label): the image with each of
  the 10 labels gives the 10 class probabilities (:func:`digit_record`);
* ``weei-bytes-v1`` (65 bytes; the model predicts bytes 1..64 from 0..63):
  the prompt's last 64 bytes with a candidate as byte 64 make a record
  whose ``accuracy`` is 1/64 higher for the model's most likely next byte
  than for any other candidate (the other 63 targets are the same in every
  record). Candidates are tried likely first (the prompt's own bytes, then
  text), and the first two scores that differ name the greedy next byte
  exactly (:func:`next_byte`): often two calls, never more than 256.

Nothing here changes the job: the module runs in a fresh instance on the
checkpoint's weights.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import struct
from typing import Any, Callable, Mapping, Sequence

from ..core.errors import UsageError, UsageReason
from ..core.formats.checkpoint import read_checkpoint
from ..runtime.abi import ModelRuntime
from ..runtime.engine import Engine
from .job_store import JobStore
from .session import Session

__all__ = ["DIGITS", "BYTES", "TRY_FORMATS", "digit_record", "digit_images", "bytes_record", "candidates", "next_byte",
           "ModelTrial", "MAX_COMPLETION_BYTES", "example_prompt", "Trials"]

DIGITS = "weei-digits-v1"
BYTES = "weei-bytes-v1"
TRY_FORMATS = (DIGITS, BYTES)
MAX_COMPLETION_BYTES = 64
_DIGIT_RECORD = 65
_CONTEXT = 64
#: The order candidates are tried in after the prompt's own bytes: what the reference text is made of.
_TEXT_ORDER = b" \n0123456789etaoinsrhldcumfpgwybvkxjqz=+-*/()[]{}<>.,:;?!'\"ETAOINSRHLDCUMFPGWYBVKXJQZ_#%&@|~^$`\\"


def digit_record(pixels: bytes, label: int) -> bytes:
    """A ``weei-digits-v1`` file of one record: 64 intensities 0..16 and ``label``."""
    return b"WDG1" + struct.pack("<I", 1) + bytes(pixels[:64]) + bytes([label])


def digit_images(validation: bytes) -> list[tuple[bytes, int]]:
    """The (pixels, label) records of a ``weei-digits-v1`` file (the job's held-out validation file)."""
    if validation[:4] != b"WDG1" or len(validation) < 8:
        return []
    (count,) = struct.unpack_from("<I", validation, 4)
    if len(validation) != 8 + count * _DIGIT_RECORD:
        return []
    return [(validation[8 + i * _DIGIT_RECORD: 8 + i * _DIGIT_RECORD + 64], validation[8 + i * _DIGIT_RECORD + 64])
            for i in range(count)]


def bytes_record(context: bytes, candidate: int) -> bytes:
    """A ``weei-bytes-v1`` file of one record: the last 64 bytes of ``context`` (left-padded with spaces)
    and ``candidate`` as byte 64, the target of the last position only."""
    window = context[-_CONTEXT:].rjust(_CONTEXT, b" ")
    return b"WBT1" + struct.pack("<I", 1) + window + bytes([candidate])


def candidates(context: bytes) -> list[int]:
    """Every byte, the likely ones first: the context's own bytes (latest first), then text."""
    return list(dict.fromkeys([*reversed(context[-_CONTEXT:]), *_TEXT_ORDER, *range(256)]))


def next_byte(accuracy_of: Callable[[int], float], context: bytes) -> tuple[int, int]:
    """The model's most likely next byte after ``context``, exactly; returns (byte, candidates scored).

    ``accuracy_of(c)`` is ``evaluate``'s accuracy on :func:`bytes_record` (context, c): the share of the
    record's 64 positions whose most likely byte is the target. The first 63 targets are the same in every
    record, so exactly one candidate, the argmax, scores 1/64 more than the others: the first two scores
    that differ name it."""
    first: float | None = None
    first_byte = -1
    for scored, candidate in enumerate(candidates(context), start=1):
        accuracy = accuracy_of(candidate)
        if first is None:
            first, first_byte = accuracy, candidate
            continue
        if accuracy > first + _HALF_STEP:
            return candidate, scored
        if accuracy < first - _HALF_STEP:
            return first_byte, scored
    return first_byte, 256  # no candidate stood out: a tie of logits, the first is as good as any


_HALF_STEP = 0.5 / _CONTEXT


class ModelTrial:
    """A checkpoint's weights in a fresh instance of its module, asked about one input at a time."""

    def __init__(self, engine: Engine, module: bytes, weights: bytes, data_formats: Sequence[str]) -> None:
        self.format = next((f for f in TRY_FORMATS if f in data_formats), None)
        if self.format is None:
            raise UsageError(UsageReason.NOT_TRYABLE, "this model's data formats ("
                             + ", ".join(list(data_formats)[:4]) + ") have no try-it view: weei knows "
                             + " and ".join(TRY_FORMATS))
        self.runtime = ModelRuntime.load(module, engine)
        self.runtime.load_model(weights)

    def _metric(self, data: bytes, metric: str) -> float:
        value = self.runtime.evaluate(data=data, format=self.format).metrics.get(metric)
        if not isinstance(value, (int, float)):
            raise UsageError(UsageReason.NOT_TRYABLE, f"the model's evaluate reports no {metric}")
        return float(value)

    async def classify(self, pixels: bytes) -> list[float]:
        """The 10 class probabilities of an 8×8 image (``weei-digits-v1``)."""
        self._need(DIGITS)
        losses = []
        for label in range(10):
            losses.append(self._metric(digit_record(pixels, label), "loss"))
            await asyncio.sleep(0)  # the controller's other work goes on between calls
        scores = [math.exp(-x) for x in losses]
        total = sum(scores) or 1.0
        return [s / total for s in scores]

    async def complete(self, prompt: bytes, max_bytes: int, stop: bytes = b"\n") -> dict[str, Any]:
        """Greedy completion of ``prompt`` (``weei-bytes-v1``): up to ``max_bytes``, ending after ``stop``."""
        self._need(BYTES)
        text, calls = bytearray(prompt), 0
        for _ in range(max(1, min(max_bytes, MAX_COMPLETION_BYTES))):
            context = bytes(text)
            byte, scored = next_byte(lambda c: self._metric(bytes_record(context, c), "accuracy"), context)
            calls += scored
            text.append(byte)
            await asyncio.sleep(0)  # the controller's other work goes on between bytes
            if bytes([byte]) == stop:
                break
        return {"completion": bytes(text[len(prompt):]).decode("utf-8", "replace"), "evaluateCalls": calls}

    def _need(self, fmt: str) -> None:
        if self.format != fmt:
            raise UsageError(UsageReason.NOT_TRYABLE, f"this model reads {self.format}, not {fmt}")


def example_prompt(validation: bytes, index: int) -> str | None:
    """A prompt from the job's held-out ``weei-bytes-v1`` file: line ``index`` (mod the count) cut after its
    last '=' or '->', so the model is asked for the answer; None when the file has no such line."""
    if validation[:4] != b"WBT1" or len(validation) < 8:
        return None
    (count,) = struct.unpack_from("<I", validation, 4)
    if len(validation) != 8 + count * 65:
        return None
    # Records are cut from one text at a stride of 64: their first 64 bytes, in order, are that text.
    text = b"".join(validation[8 + i * 65: 8 + i * 65 + 64] for i in range(count)).decode("ascii", "replace")
    lines = [line for line in text.split("\n")[1:-1] if "=" in line or "->" in line]
    if not lines:
        return None
    line = lines[index % len(lines)]
    cut = max(line.rfind("="), line.rfind("->") + 1)
    return line[: cut + 1] + (" " if line[cut + 1: cut + 2] == " " else "")


class Trials:
    """``tryCheckpoint(request)`` for the controller: the latest checkpoint of this device's job, on a trial
    instance kept until the checkpoint changes."""

    def __init__(self, session: Session, store: JobStore, engine: Engine) -> None:
        self.session = session
        self.store = store
        self.engine = engine
        self._trial: tuple[str, ModelTrial] | None = None

    async def run(self, request: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(request, Mapping):
            raise UsageError(UsageReason.INVALID_ARGUMENT, "tryCheckpoint takes an object")
        coordinator = self.session.coordinator
        if coordinator is None:
            raise UsageError(UsageReason.NO_JOB, "trying a checkpoint needs a job this device coordinates")
        if self.store.latest_checkpoint is None:
            raise UsageError(UsageReason.NO_CHECKPOINT, "there is no checkpoint to try yet")
        name, file = self.store.latest_checkpoint
        checkpoint = read_checkpoint(file)
        key = hashlib.sha256(file).hexdigest()
        if self._trial is None or self._trial[0] != key:
            self._trial = None
            await self.store.load_artifacts([coordinator.spec.module.sha256])
            module = self.store.module(coordinator.spec.module.sha256)
            self._trial = (key, ModelTrial(self.engine, module, checkpoint.weights,
                                           [f.id for f in coordinator.spec.info.data_formats]))
        trial = self._trial[1]
        out: dict[str, Any] = {"round": checkpoint.metadata.round, "checkpoint": name, "format": trial.format}
        validation = await self._validation()
        index = request.get("example", 0)
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise UsageError(UsageReason.INVALID_ARGUMENT, "example must be a whole number from 0")
        if trial.format == DIGITS:
            images = digit_images(validation) if validation is not None else []
            if not images:
                raise UsageError(UsageReason.NO_VALIDATION_FILE, "digits are tried on the job's held-out images: "
                                 "create the job with its validation file")
            pixels, label = images[index % len(images)]
            probabilities = await trial.classify(pixels)
            return {**out, "example": index % len(images), "examples": len(images), "pixels": list(pixels),
                    "label": label, "probabilities": probabilities,
                    "predicted": max(range(10), key=probabilities.__getitem__)}
        prompt = request.get("prompt")
        if prompt is None:
            prompt = example_prompt(validation, index) if validation is not None else None
            if prompt is None:
                raise UsageError(UsageReason.INVALID_ARGUMENT, "give a prompt (this job has no held-out text)")
        if not isinstance(prompt, str) or not prompt or len(prompt.encode()) > 4096:
            raise UsageError(UsageReason.INVALID_ARGUMENT, "prompt must be a text of 1 to 4096 bytes")
        max_bytes = request.get("maxBytes", 24)
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or not 1 <= max_bytes <= MAX_COMPLETION_BYTES:
            raise UsageError(UsageReason.INVALID_ARGUMENT, f"maxBytes must be a whole number from 1 to {MAX_COMPLETION_BYTES}")
        return {**out, "prompt": prompt, **await trial.complete(prompt.encode(), max_bytes)}

    async def _validation(self) -> bytes | None:
        sha = self.session.validation_sha256
        if sha is None:
            return None
        if await self.store.load_artifacts([sha]):
            return None
        return self.store.artifacts.get(sha)
