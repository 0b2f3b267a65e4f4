"""What the page keeps in IndexedDB: each byte once, nothing after deleteSavedJob, and a full
storage (QuotaExceededError) named by reason without losing a saved job."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from test_api import DIGITS, ready


def test_storage_holds_each_file_once_refuses_by_name_when_full_and_empties_on_delete(weei_server: Any,
                                                                                       page: Any) -> None:
    pg, log = page
    ready(pg, weei_server.url)
    first = pg.evaluate("""async (settings) => {
      const training = T.api();
      const pkg = await T.pkg('digits-mlp');
      const id = await training.createJob({ ...pkg, settings });
      await training.start();
      await T.waitFor('the job to complete', () => T.done(training.getState()), 90000);
      await training.leave();
      const keys = async () => ({ jobs: await training._debug.storageKeys('jobs'),
        checkpoints: await training._debug.storageKeys('checkpoints'),
        artifacts: await training._debug.storageKeys('artifacts') });
      return { id, keys: await keys(), usage: (await navigator.storage.estimate()).usage || 0 };
    }""", DIGITS)
    # 15 chunks, one round each, plus checkpoint 0; the module, 15 chunks and the validation file,
    # and no copy of any round's weights beside its checkpoint.
    assert len(first["keys"]["checkpoints"]) == 16 and first["keys"]["jobs"] == [first["id"]]
    assert len(first["keys"]["artifacts"]) == 17

    origin = "{0.scheme}://{0.netloc}".format(urlsplit(pg.url))
    cdp = pg.context.new_cdp_session(pg)
    cdp.send("Storage.overrideQuotaForOrigin", {"origin": origin, "quotaSize": first["usage"] + 2000})
    full = pg.evaluate("""async (settings) => {
      const training = T.api();
      const pkg = await T.pkg('digits-mlp');
      const refused = await T.rejection(() => training.createJob({ ...pkg, settings }));
      const s = training.getState();
      return { refused, error: s.error, job: s.job || null, saved: s.savedJobs.map((j) => j.id),
               checkpoints: await training._debug.storageKeys('checkpoints'),
               events: training.getDebugLog().events.filter((e) => e.event === 'storage.refused') };
    }""", DIGITS)
    assert full["refused"] and full["refused"]["reason"] == "storage-quota-exceeded", full
    assert "storage-quota-exceeded" in full["error"] and full["job"] is None
    assert full["events"] and full["events"][0]["details"]["reason"] == "storage-quota-exceeded"
    # The saved job is untouched.
    assert full["saved"] == [first["id"]] and full["checkpoints"] == first["keys"]["checkpoints"]

    cdp.send("Storage.overrideQuotaForOrigin", {"origin": origin})
    after = pg.evaluate("""async (id) => {
      const training = T.api();
      await training.deleteSavedJob(id);
      return { jobs: await training._debug.storageKeys('jobs'),
               checkpoints: await training._debug.storageKeys('checkpoints'),
               artifacts: await training._debug.storageKeys('artifacts'), saved: training.getState().savedJobs };
    }""", first["id"])
    assert after == {"jobs": [], "checkpoints": [], "artifacts": [], "saved": []}
    assert not log.errors, log.errors
