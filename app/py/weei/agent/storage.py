"""Disk Storage and KeyValue ports for the agent: a directory that survives restarts.

Layout of ``root``::

    records/<store>/<key, percent-encoded>.json   one JSON record per key
    blobs/<sha256>                                 every bytes value, by content
    kv.json                                        the KeyValue strings

A record is the stored value as JSON in which every ``bytes`` value is
replaced by ``{"$blob": sha256, "bytes": n}``; the bytes live once in
``blobs/`` (an artifact, a checkpoint file). Each file is written to a
temporary file in the same directory, flushed with ``fsync`` and renamed
over its name, blobs before the record that names them, so a crash leaves
either the old value or the new one, never half of one. A blob is checked
against its SHA-256 when read. Values come back as fresh objects (tuples
as lists), like IndexedDB's structured clone.

The storage keeps its files in its own directories: ``records``, each
store's folder and ``blobs`` may not be symbolic links (``root`` itself may
be one), and garbage collection deletes only regular files with the names
it gives, never following a link, so a link planted there cannot make it
write or delete files elsewhere.

Errors are :class:`~weei.api.ports.StorageError`: ``corrupt`` when what is
on disk is not what was written, ``storage-quota-exceeded`` when the disk
is full (the old value stays), ``storage-failed`` for another refused write,
``storage-symlink`` when one of its directories is a symbolic link.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote, unquote

from ..api.ports import STORAGE_QUOTA_EXCEEDED, StorageError, StorageReason
from ..core._check import MAX_JSON_DEPTH, parse_json
from ..core.errors import UsageError, UsageReason

__all__ = ["DiskStorage", "DiskKeyValue", "StorageError"]

_STORE = re.compile(r"[a-z][a-z0-9_-]{0,63}")
_BLOB = "$blob"
_SHA = re.compile(r"[0-9a-f]{64}")
# A record holds checked documents (model info, settings: at most
# MAX_JSON_DEPTH deep) a few levels down; _decode recurses once per level.
_MAX_RECORD_DEPTH = 2 * MAX_JSON_DEPTH


def _own_dir(path: Path) -> Path:
    """``path``, unless it is a symbolic link (then StorageError 'storage-symlink')."""
    if path.is_symlink():
        raise StorageError(StorageReason.STORAGE_SYMLINK, f"{path} is a symbolic link: the storage keeps its files only in "
                                              "its own directories")
    return path


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with _suppress_os():
            os.unlink(tmp)
        raise


class _suppress_os:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, value: Any, tb: Any) -> bool:
        return kind is not None and issubclass(kind, OSError)


class DiskStorage:
    """The ``Storage`` port on a directory. Operations run one at a time, off the event loop."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = asyncio.Lock()
        self.puts = 0

    # -------------------------------------------------------------- the port

    async def put(self, store: str, key: str, value: Any) -> None:
        path = self._record_path(store, key)
        blobs: dict[str, bytes] = {}
        text = json.dumps(_encode(value, blobs), ensure_ascii=False, allow_nan=False).encode()
        async with self._lock:
            try:
                await asyncio.to_thread(self._put, path, text, blobs)
            except OSError as exc:
                # A full disk is the agent's QuotaExceededError; the old value stays (atomic writes).
                full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
                raise StorageError(STORAGE_QUOTA_EXCEEDED if full else StorageReason.STORAGE_FAILED,
                                   f"{store}/{key}: {exc.strerror or exc}") from None
            self.puts += 1

    async def get(self, store: str, key: str) -> Any:
        path = self._record_path(store, key)
        async with self._lock:
            return await asyncio.to_thread(self._get, path)

    async def delete(self, store: str, key: str) -> None:
        path = self._record_path(store, key)
        async with self._lock:
            with _suppress_os():
                path.unlink()

    async def keys(self, store: str) -> list[str]:
        folder = self._store_dir(store)
        self._blobs()
        if not folder.is_dir():
            return []
        return sorted(unquote(p.name[:-5]) for p in folder.iterdir() if p.name.endswith(".json")
                      and not p.name.startswith(".tmp-"))

    # ------------------------------------------------------------ extras

    def has_blob(self, sha256: str) -> bool:
        """Whether the bytes with this SHA-256 are on disk."""
        return bool(_SHA.fullmatch(sha256)) and (self._blobs() / sha256).is_file()

    async def collect_garbage(self) -> int:
        """Delete blobs no record names (and stale temporary files); returns how many files went."""
        async with self._lock:
            return await asyncio.to_thread(self._collect)

    # ---------------------------------------------------------- internals

    def _store_dir(self, store: str) -> Path:
        if not isinstance(store, str) or not _STORE.fullmatch(store):
            raise UsageError(UsageReason.BAD_STORE, f"store name {store!r} must match {_STORE.pattern}")
        return _own_dir(_own_dir(self.root / "records") / store)

    def _blobs(self) -> Path:
        return _own_dir(self.root / "blobs")

    def _record_path(self, store: str, key: str) -> Path:
        if not isinstance(key, str) or not key or len(key) > 200:
            raise UsageError(UsageReason.BAD_KEY, "a storage key is a string of 1 to 200 characters")
        return self._store_dir(store) / (quote(key, safe="") + ".json")

    def _put(self, path: Path, text: bytes, blobs: dict[str, bytes]) -> None:
        for sha, data in blobs.items():
            if not self.has_blob(sha):
                _write_atomic(self._blobs() / sha, data)
        _write_atomic(path, text)

    def _get(self, path: Path) -> Any:
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            return None
        return _decode(_parse_record(path, text), self._read_blob)

    def _read_blob(self, sha: str, size: int) -> bytes:
        path = self._blobs() / sha
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise StorageError(StorageReason.CORRUPT, f"blob {sha[:12]}… named by a record is missing") from None
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
            raise StorageError(StorageReason.CORRUPT, f"blob {sha[:12]}… does not match its SHA-256 or size")
        return data

    def _collect(self) -> int:
        named: set[str] = set()
        removed = 0
        records = _own_dir(self.root / "records")
        blobs = self._blobs()  # refused before anything is deleted
        for folder in records.iterdir() if records.is_dir() else ():
            if not _STORE.fullmatch(folder.name):
                continue  # not a store this storage made
            for entry in _files(_own_dir(folder)):
                if entry.name.startswith(".tmp-"):
                    os.unlink(entry.path)
                    removed += 1
                elif entry.name.endswith(".json"):
                    path = Path(entry.path)
                    _decode(_parse_record(path, path.read_bytes()), lambda sha, size: named.add(sha) or b"")
        for entry in _files(blobs):
            if (_SHA.fullmatch(entry.name) or entry.name.startswith(".tmp-")) and entry.name not in named:
                os.unlink(entry.path)
                removed += 1
        return removed


def _files(folder: Path) -> list[os.DirEntry[str]]:
    """The regular files directly in ``folder`` (none if it is missing); links are not followed, nor listed."""
    if not folder.is_dir():
        return []
    with os.scandir(folder) as entries:
        return [e for e in entries if e.is_file(follow_symlinks=False)]


def _parse_record(path: Path, data: bytes) -> Any:
    """A record file's JSON; StorageError('corrupt') for bad UTF-8 or JSON, or nesting past _MAX_RECORD_DEPTH."""

    def corrupt(message: str) -> NoReturn:
        raise StorageError(StorageReason.CORRUPT, f"{path} {message}")

    return parse_json(data, corrupt, _MAX_RECORD_DEPTH)


def _encode(value: Any, blobs: dict[str, bytes]) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        sha = hashlib.sha256(data).hexdigest()
        blobs[sha] = data
        return {_BLOB: sha, "bytes": len(data)}
    if isinstance(value, dict):
        if _BLOB in value:
            raise UsageError(UsageReason.BAD_VALUE, f"a stored dict may not have the key {_BLOB!r}")
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise UsageError(UsageReason.BAD_VALUE, "stored dicts need string keys")
            out[k] = _encode(v, blobs)
        return out
    if isinstance(value, (list, tuple)):
        return [_encode(v, blobs) for v in value]
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    raise UsageError(UsageReason.BAD_VALUE, f"cannot store a {type(value).__name__}")


def _decode(value: Any, blob: Any) -> Any:
    if isinstance(value, dict):
        if _BLOB in value:
            sha, size = value[_BLOB], value.get("bytes")
            if not isinstance(sha, str) or not _SHA.fullmatch(sha) or not isinstance(size, int):
                raise StorageError(StorageReason.CORRUPT, "a record names a blob badly")
            return blob(sha, size)
        return {k: _decode(v, blob) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, blob) for v in value]
    return value


class DiskKeyValue:
    """The ``KeyValue`` port: small strings in one JSON file, rewritten atomically on each set."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.values: dict[str, str] = {}
        try:
            loaded = _parse_record(self.path, self.path.read_bytes())
        except FileNotFoundError:
            loaded = {}
        if isinstance(loaded, dict):
            self.values = {str(k): str(v) for k, v in loaded.items()}

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def set(self, key: str, value: str) -> None:
        if self.values.get(key) == value:
            return
        self.values[key] = value
        _write_atomic(self.path, json.dumps(self.values, ensure_ascii=False).encode())
