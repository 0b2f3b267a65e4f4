"""Per-kind file limits: checkpoints and modules 256 MB, auxiliary weights files 2 GiB (checked on sizes alone)."""

from __future__ import annotations

import pytest

from weei.core.formats.checkpoint import MAX_CHECKPOINT_FILE_BYTES
from weei.core.errors import ManifestError
from weei.core.wire.framing import FrameReader, ReaderLimits, TransferFailed, artifact_begin_frame
from weei.core.limits import MAX_AUXILIARY_BYTES, MAX_FILE_BYTES, check_file_size, check_selection_sizes, max_bytes
from weei.core.formats.modelinfo import parse_auxiliary_weights

MB = 1_000_000
H0 = "0" * 64


def reason_of(fn, *args) -> str | None:  # type: ignore[no-untyped-def]
    try:
        fn(*args)
    except ManifestError as exc:
        return exc.reason
    return None


def test_the_limits_are_the_specs() -> None:
    assert MAX_FILE_BYTES == 256 * MB == MAX_CHECKPOINT_FILE_BYTES
    assert MAX_AUXILIARY_BYTES == 2 * 1024**3
    assert max_bytes("auxiliary") == MAX_AUXILIARY_BYTES
    assert {max_bytes(k) for k in ("module", "checkpoint", "chunk", "snapshot", "update")} == {MAX_FILE_BYTES}


def test_a_300_mb_auxiliary_file_passes_where_a_300_mb_module_is_refused() -> None:
    check_selection_sizes({"reward.bin": 300 * MB, "train.bin": 1000}, ["reward.bin"])
    check_file_size("auxiliary", "reward.bin", MAX_AUXILIARY_BYTES)
    assert reason_of(check_file_size, "module", "model.wasm", 300 * MB) == "file-too-large"
    assert reason_of(check_file_size, "checkpoint", "x.weei-checkpoint", 300 * MB) == "file-too-large"
    # The same size as a dataset chunk is over the limit; an auxiliary file over 2 GiB too.
    assert reason_of(check_selection_sizes, {"reward.bin": 300 * MB}, []) == "file-too-large"
    assert reason_of(check_selection_sizes, {"reward.bin": MAX_AUXILIARY_BYTES + 4}, ["reward.bin"]) == "file-too-large"
    with pytest.raises(ManifestError, match="reward.bin"):
        check_selection_sizes({"reward.bin": 300 * MB}, [])


def test_a_300_mb_auxiliary_slot_descriptor_is_valid() -> None:
    slot = {"id": "reward", "role": "reward-model", "bytes": 300 * MB, "sha256": "a" * 64, "fileName": "reward.bin"}
    (parsed,) = parse_auxiliary_weights([slot], in_package=True, path="package.auxiliaryWeights")
    assert parsed.bytes == 300 * MB and parsed.file_name == "reward.bin"


def test_the_reader_accepts_a_2_gib_auxiliary_file_and_256_mb_of_anything_else() -> None:
    reader = FrameReader("p")  # default limits; the begin frame reserves, nothing is allocated
    events = reader.feed(artifact_begin_frame(1, "auxiliary", H0, MAX_AUXILIARY_BYTES), 0.0)
    assert not [e for e in events if isinstance(e, TransferFailed)]
    assert reader.buffered_bytes == MAX_AUXILIARY_BYTES and reader.open_transfers == 1
    # ... and a maximal checkpoint alongside it.
    reader.feed(artifact_begin_frame(2, "checkpoint", H0, MAX_FILE_BYTES), 0.0)
    assert reader.buffered_bytes == MAX_AUXILIARY_BYTES + MAX_FILE_BYTES
    refused = [e.reason for e in reader.feed(artifact_begin_frame(3, "checkpoint", H0, MAX_FILE_BYTES + 1), 0.0)
               + reader.feed(artifact_begin_frame(4, "module", H0, 300 * MB), 0.0)
               + reader.feed(artifact_begin_frame(5, "auxiliary", H0, MAX_AUXILIARY_BYTES + 1), 0.0)
               if isinstance(e, TransferFailed)]
    assert refused == ["too-large"] * 3
    assert reader.open_transfers == 2
    small = FrameReader("p", limits=ReaderLimits(max_artifact_bytes=1000, max_auxiliary_bytes=5000))
    assert not [e for e in small.feed(artifact_begin_frame(1, "auxiliary", H0, 4000), 0.0) if isinstance(e, TransferFailed)]
    assert [e.reason for e in small.feed(artifact_begin_frame(2, "chunk", H0, 4000), 0.0)
            if isinstance(e, TransferFailed)] == ["too-large"]
