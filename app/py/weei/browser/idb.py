"""The controller's Storage port over IndexedDB (Pyodide, in the host worker).

Theory of operation
-------------------
One database, ``weei``, with five object stores of out-of-line string keys
and no key generator: ``jobs``, ``checkpoints``, ``artifacts``, ``settings``
and ``quarantine`` (see docs/architecture.md, Persistence).

The database is Weei's when it has those stores, whatever its version
number: anything on the origin may have made a database of that name first
(a bare ``indexedDB.open('weei')`` makes version 1 with no store). So
:meth:`IndexedDBStorage.open` opens the version there is, and when a store is
missing or of another shape it asks for the next version and, in the
upgrade, creates what is missing and replaces what is misshapen (a store
Weei never made holds nothing of Weei's). Taking a fresh database name
instead would leave the jobs of an older version behind under the old one. Values are what the controller
hands over: ``bytes`` are stored as a ``Uint8Array`` and come back as
``bytes``; dicts (with bytes inside, as a checkpoint entry has) go through
:func:`~weei.browser.convert.to_js_value` and come back as dicts.

Every request is awaited as an asyncio future resolved by its ``success`` /
``error`` event; a ``put`` or ``delete`` returns only when its transaction
fired ``complete`` (a transaction that fails fires ``abort`` after the
request's ``error``, so ``complete``/``abort`` is the terminal pair). The
handlers are ``create_proxy`` proxies owned by the future: both are
destroyed when it is done, and no event fires on a request or transaction
after its terminal one.

Errors: a failing request or transaction raises :class:`StorageError`
(``reason`` 'storage-quota-exceeded' for a QuotaExceededError, else
'storage-failed');
opening raises it with 'storage-unavailable'.
"""

from __future__ import annotations

import asyncio
from typing import Any

import js  # type: ignore[import-not-found]
from pyodide.ffi import JsException, create_proxy  # type: ignore[import-not-found]

from weei.api.ports import STORAGE_QUOTA_EXCEEDED, StorageError, StorageReason

from .convert import from_js_value, is_nullish, to_js_value
from .engine import to_uint8array

__all__ = ["IndexedDBStorage", "StorageError", "DB_NAME", "STORES"]

DB_NAME = "weei"
STORES = ("jobs", "checkpoints", "artifacts", "settings", "quarantine")


def _describe(error: Any) -> tuple[StorageReason, str]:
    if is_nullish(error):
        return StorageReason.STORAGE_FAILED, "the transaction was aborted"
    name = str(getattr(error, "name", "Error"))
    message = str(getattr(error, "message", error))
    reason = STORAGE_QUOTA_EXCEEDED if name == "QuotaExceededError" else StorageReason.STORAGE_FAILED
    return reason, f"{name}: {message}"


def _wait(target: Any, ok: str, fail: str, result: Any = None) -> asyncio.Future[Any]:
    """A future for the first of ``ok``/``fail`` on ``target``; it owns both handlers."""
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def on_ok(_event: Any) -> None:
        if not future.done():
            future.set_result(result(target) if result is not None else None)

    def on_fail(_event: Any) -> None:
        if not future.done():
            reason, message = _describe(getattr(target, "error", None))
            future.set_exception(StorageError(reason, f"IndexedDB: {message}"))

    proxies = (create_proxy(on_ok), create_proxy(on_fail))
    target.addEventListener(ok, proxies[0])
    target.addEventListener(fail, proxies[1])

    def release(_future: Any) -> None:
        target.removeEventListener(ok, proxies[0])
        target.removeEventListener(fail, proxies[1])
        for proxy in proxies:
            proxy.destroy()

    future.add_done_callback(release)
    return future


def _encode(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return to_uint8array(value)
    return to_js_value(value)


class IndexedDBStorage:
    """:class:`weei.api.ports.Storage` over one IndexedDB database. Use :meth:`open`."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self._on_version_change = create_proxy(lambda _e: self.close())
        db.addEventListener("versionchange", self._on_version_change)

    @classmethod
    async def open(cls, name: str = DB_NAME) -> IndexedDBStorage:
        """Open, creating or repairing the stores (see above). Raises StorageError('storage-unavailable')."""
        factory = getattr(js, "indexedDB", None)
        if is_nullish(factory):
            raise StorageError(StorageReason.STORAGE_UNAVAILABLE, "IndexedDB is not available in this browser context")
        db = await _open(factory, name, None)
        unfit = _unfit_stores(db)
        if unfit:
            version = int(db.version) + 1
            db.close()
            db = await _open(factory, name, version)
            unfit = _unfit_stores(db)
            if unfit:
                db.close()
                raise StorageError(StorageReason.STORAGE_UNAVAILABLE, f"IndexedDB: database {name!r} lacks the stores "
                                                          f"{', '.join(unfit)} after an upgrade")
        return cls(db)

    def close(self) -> None:
        """Close the connection (another tab wants to upgrade, or the page is done)."""
        if self._db is not None:
            self._db.close()
            self._db.removeEventListener("versionchange", self._on_version_change)
            self._on_version_change.destroy()
            self._db = None

    def _transaction(self, store: str, mode: str) -> Any:
        if self._db is None:
            raise StorageError(StorageReason.STORAGE_UNAVAILABLE, "the IndexedDB connection is closed")
        if store not in STORES:
            raise StorageError(StorageReason.STORAGE_FAILED, f"unknown store {store!r}")
        try:
            return self._db.transaction(store, mode)
        except JsException as exc:
            raise StorageError(StorageReason.STORAGE_FAILED, f"IndexedDB: {exc}") from None

    async def _write(self, store: str, action: Any) -> None:
        tx = self._transaction(store, "readwrite")
        done = _wait(tx, "complete", "abort")
        try:
            action(tx.objectStore(store))
        except JsException as exc:  # DataCloneError, ReadOnlyError...
            try:
                tx.abort()
            except JsException:
                pass
            await asyncio.gather(done, return_exceptions=True)
            quota = getattr(exc, "name", "") == "QuotaExceededError"
            raise StorageError(STORAGE_QUOTA_EXCEEDED if quota else StorageReason.STORAGE_FAILED, f"IndexedDB: {exc}") from None
        await done

    async def put(self, store: str, key: str, value: Any) -> None:
        """Store ``value`` under ``key``; returns once the transaction completed."""
        encoded = _encode(value)
        await self._write(store, lambda s: s.put(encoded, key))

    async def delete(self, store: str, key: str) -> None:
        await self._write(store, lambda s: s.delete(key))

    async def get(self, store: str, key: str) -> Any:
        """The stored value (bytes, dict, ...) or None."""
        tx = self._transaction(store, "readonly")
        request = tx.objectStore(store).get(key)
        value = await _wait(request, "success", "error", result=lambda r: r.result)
        return from_js_value(value)

    async def keys(self, store: str) -> list[str]:
        """Every key of ``store``, sorted."""
        tx = self._transaction(store, "readonly")
        request = tx.objectStore(store).getAllKeys()
        keys = await _wait(request, "success", "error", result=lambda r: r.result)
        return sorted(str(k) for k in keys.to_py())


def _fit(store: Any) -> bool:
    """Weei's shape of store: keys given with each put (no key path), no key generator."""
    return is_nullish(store.keyPath) and not bool(store.autoIncrement)


def _unfit_stores(db: Any) -> list[str]:
    """The stores of :data:`STORES` that ``db`` lacks or has in another shape."""
    unfit = []
    for name in STORES:
        if not db.objectStoreNames.contains(name):
            unfit.append(name)
            continue
        try:
            store = db.transaction(name, "readonly").objectStore(name)
        except JsException:
            unfit.append(name)
            continue
        if not _fit(store):
            unfit.append(name)
    return unfit


async def _open(factory: Any, name: str, version: int | None) -> Any:
    """Open ``name`` (at ``version``, or at the version there is); an upgrade makes every store fit."""
    try:
        request = factory.open(name) if version is None else factory.open(name, version)
    except JsException as exc:
        raise StorageError(StorageReason.STORAGE_UNAVAILABLE, f"IndexedDB: {exc}") from None

    def upgrade(_event: Any) -> None:
        db, tx = request.result, request.transaction
        for store in STORES:
            if db.objectStoreNames.contains(store):
                if _fit(tx.objectStore(store)):
                    continue
                db.deleteObjectStore(store)
            db.createObjectStore(store)

    upgrade_proxy = create_proxy(upgrade)
    request.addEventListener("upgradeneeded", upgrade_proxy)
    try:
        return await _wait(request, "success", "error", result=lambda r: r.result)
    except StorageError as exc:
        raise StorageError(StorageReason.STORAGE_UNAVAILABLE, exc.message) from None
    finally:
        request.removeEventListener("upgradeneeded", upgrade_proxy)
        upgrade_proxy.destroy()
