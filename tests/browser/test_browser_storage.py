"""What the page keeps in IndexedDB: each byte once, and nothing after deleteSavedJob."""

from __future__ import annotations

from typing import Any

from test_api import DIGITS, ready


def test_indexeddb_holds_each_file_once_and_is_empty_after_delete(weei_server: Any, page: Any) -> None:
    pg, log = page
    ready(pg, weei_server.url)
    out = pg.evaluate("""async (settings) => {
      const training = T.api();
      const keys = async () => ({ jobs: await T.hooks().storageKeys('jobs'),
        checkpoints: await T.hooks().storageKeys('checkpoints'),
        artifacts: await T.hooks().storageKeys('artifacts') });
      const pkg = await T.pkg('digits-mlp');
      const id = await training.createJob({ ...pkg, settings });
      await training.start();
      await T.waitFor('the job to complete', () => T.done(training.getState()), 90000);
      await training.leave();
      const stored = await keys();
      await training.deleteSavedJob(id);
      return { id, stored, deleted: await keys(), saved: training.getState().savedJobs };
    }""", DIGITS)
    stored = out["stored"]
    # 15 chunks, one round each, plus checkpoint 0; the module, 15 chunks and the validation file,
    # and no copy of any round's weights beside its checkpoint.
    # The job record and, beside it, who takes part (written apart: a join does not rewrite the chunk list).
    assert stored["jobs"] == [out["id"], out["id"] + "/members"] and len(stored["checkpoints"]) == 16
    assert len(stored["artifacts"]) == 17
    assert out["deleted"] == {"jobs": [], "checkpoints": [], "artifacts": []} and out["saved"] == []
    assert not log.errors, log.errors


def test_a_bare_weei_database_and_tampered_storage_do_not_stop_weei(weei_server: Any, page: Any) -> None:
    """Issue 20, finding 7: another script of the origin made 'weei' first (version 1, no stores) and wrote
    garbage where Weei keeps its debug log; later a device setting Weei cannot read. Weei starts each time."""
    pg, log = page
    pg.goto(weei_server.url)
    pg.evaluate("""() => new Promise((resolve, reject) => {
      localStorage.setItem('weei.debugLog', '{"events": [garbage');
      const request = indexedDB.open('weei');
      request.onsuccess = () => { request.result.close(); resolve(); };
      request.onerror = () => reject(request.error);
    })""")
    ready(pg)
    first = pg.evaluate("""async () => {
      const training = T.api();
      const pkg = await T.pkg('digits-mlp');
      const id = await training.createJob({ ...pkg, settings: { epochs: 1, localEpochs: 1, batchSize: 16,
                                                                coordinatorParticipates: true } });
      await training.leave();
      const db = await new Promise((resolve) => { const r = indexedDB.open('weei'); r.onsuccess = () => resolve(r.result); });
      const stores = Array.from(db.objectStoreNames).sort();
      const version = db.version;
      await new Promise((resolve, reject) => {
        const tx = db.transaction('settings', 'readwrite');
        tx.objectStore('settings').put({ maxLocalWorkers: 'many' }, 'device');
        tx.oncomplete = resolve; tx.onerror = () => reject(tx.error);
      });
      db.close();
      return { id, stores, version, jobs: await T.hooks().storageKeys('jobs') };
    }""")
    assert first["stores"] == ["artifacts", "checkpoints", "jobs", "quarantine", "settings"]
    assert first["version"] == 2 and first["jobs"] == [first["id"], first["id"] + "/members"]
    pg.reload()
    ready(pg)
    second = pg.evaluate("""() => { const s = T.api().getState();
      return { error: s.error || '', workers: s.maxLocalWorkers, saved: s.savedJobs.map((j) => j.id),
               setAside: T.api().getDebugLog().events.filter((e) => e.event === 'storage.set-aside')
                 .map((e) => e.details.key) }; }""")
    assert "settings/device" in second["error"] and "maxLocalWorkers" in second["error"]
    assert second["setAside"] == ["device"] and isinstance(second["workers"], int) and second["workers"] >= 1
    assert second["saved"] == [first["id"]]
    assert not log.errors, log.errors
