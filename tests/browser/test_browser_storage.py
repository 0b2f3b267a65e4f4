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
    assert stored["jobs"] == [out["id"]] and len(stored["checkpoints"]) == 16
    assert len(stored["artifacts"]) == 17
    assert out["deleted"] == {"jobs": [], "checkpoints": [], "artifacts": []} and out["saved"] == []
    assert not log.errors, log.errors
