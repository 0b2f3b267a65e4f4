"""Export scikit-learn's digits as weei-digits-v1 files for the digits-mlp model.

Writes app/static/models/digits-mlp/data/: training-001.bin .. training-015.bin
(100 examples each) and validation.bin (the remaining 297), after one fixed
shuffle. The files are committed; run this only to recreate them:

    .venv/bin/python tools/export_digits.py

weei-digits-v1 (docs/abi.md): b"WDG1", u32-le example count n, then n
records of 65 bytes: 64 pixel intensities 0..16 (8x8 row-major) and the
label 0..9.
"""

from __future__ import annotations

import argparse
import struct
from pathlib import Path

import numpy as np

__all__ = ["encode", "export"]

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "app" / "static" / "models" / "digits-mlp" / "data"
SHUFFLE_SEED = 20240611
CHUNKS = 15
CHUNK_EXAMPLES = 100
MAGIC = b"WDG1"


def encode(images: np.ndarray, labels: np.ndarray) -> bytes:
    """One weei-digits-v1 file from (n, 64) intensities 0..16 and n labels 0..9."""
    images = np.asarray(images)
    labels = np.asarray(labels)
    if images.ndim != 2 or images.shape[1] != 64 or labels.shape != (images.shape[0],):
        raise ValueError(f"expected (n, 64) images and n labels, got {images.shape} and {labels.shape}")
    pixels = images.astype(np.int64)
    if pixels.min(initial=0) < 0 or pixels.max(initial=0) > 16 or not np.array_equal(pixels, images):
        raise ValueError("pixel intensities must be integers 0..16")
    if labels.min(initial=0) < 0 or labels.max(initial=0) > 9:
        raise ValueError("labels must be 0..9")
    records = np.concatenate([pixels, labels.astype(np.int64)[:, None]], axis=1).astype(np.uint8)
    return MAGIC + struct.pack("<I", len(records)) + records.tobytes()


def export(out_dir: Path = OUT_DIR) -> list[Path]:
    """Write the chunk and validation files; return their paths."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(SHUFFLE_SEED).permutation(len(digits.target))
    images, labels = digits.data[order], digits.target[order]
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for k in range(CHUNKS):
        part = slice(k * CHUNK_EXAMPLES, (k + 1) * CHUNK_EXAMPLES)
        path = out_dir / f"training-{k + 1:03d}.bin"
        path.write_bytes(encode(images[part], labels[part]))
        written.append(path)
    rest = slice(CHUNKS * CHUNK_EXAMPLES, None)
    path = out_dir / "validation.bin"
    path.write_bytes(encode(images[rest], labels[rest]))
    written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args()
    for path in export(args.out):
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
