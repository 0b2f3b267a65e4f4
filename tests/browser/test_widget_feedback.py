"""The window's feedback (issue 12): settings that need a confirmation, one error surface, the
other-model manifest message, a failed round's cause, live progress of remote peers and the
participant's window after completion."""

from __future__ import annotations

import uuid
from typing import Any

from site_helpers import ROOT
from test_api import DIGITS
from test_widget import API, HOST, fill, open_widget, state

MODELS = ROOT / "app" / "static" / "models"


def shown_errors(pg: Any) -> list[str]:
    """The texts of every visible error of the window."""
    return pg.evaluate(f"""() => [...document.querySelector('{HOST}').shadowRoot.querySelectorAll('.error')]
        .filter((e) => !e.classList.contains('hidden') && e.offsetParent !== null && e.textContent.trim())
        .map((e) => e.textContent)""")


def test_absurd_settings_ask_for_a_confirmation_and_errors_show_once(weei_server: Any, page: Any) -> None:
    pg, log = page
    pg.set_viewport_size({"width": 1280, "height": 1000})
    open_widget(pg, weei_server.url)
    pg.get_by_role("button", name="Digits MLP demo").click()
    pg.get_by_text("Digits MLP demo:").wait_for()

    # A hard limit is an error naming the field, shown once (beside the button, not again in a banner).
    fill(pg, "Learning rate (optional)", "-1")
    pg.get_by_role("button", name="Create job").click()
    pg.locator(".sec-setup .error:visible").first.wait_for()
    pg.wait_for_function(f"() => !!{API}.getState().error")  # the API's state.error says it too
    pg.wait_for_timeout(300)  # a render after state.error arrived
    errors = shown_errors(pg)
    assert len(errors) == 1 and "learningRate" in errors[0], errors

    # 10^9 epochs is legal but absurd: the window names the field and asks for a second click.
    fill(pg, "Learning rate (optional)", "")
    fill(pg, "Epochs", "1000000000")
    pg.get_by_role("button", name="Create job").click()
    review = pg.locator("[data-review] .warn[data-field='epochs']").first
    review.wait_for()
    assert "1,000,000,000 passes" in review.inner_text()
    anyway = pg.get_by_role("button", name="Create anyway")
    anyway.wait_for()
    assert "job" not in state(pg)
    # The old error went when the new action began.
    assert shown_errors(pg) == [], shown_errors(pg)
    # Changing a value withdraws the confirmation; an ordinary value creates the job at once.
    fill(pg, "Epochs", "2")
    pg.get_by_role("button", name="Create job").click()
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'ready'")
    assert state(pg)["job"]["settings"]["epochs"] == 2

    # Apply settings to the job: a learning rate of 10^9 needs a confirmation too, then applies.
    # The form folds away once a job exists (on the render that first shows the job): wait for it, reopen it.
    pg.wait_for_function("() => document.querySelector('[data-weei-widget]').shadowRoot"
                         ".querySelector('details.settings').open === false")
    pg.locator("details.settings summary").click()
    fill(pg, "Learning rate (optional)", "1000000000")
    pg.get_by_role("button", name="Apply settings to job").click()
    pg.locator("[data-review] .warn[data-field='learningRate']").first.wait_for()
    assert "learningRate" not in state(pg)["job"]["settings"]
    pg.get_by_role("button", name="Apply anyway").click()
    pg.wait_for_function(f"() => {API}.getState().job.settings.learningRate === 1e9")
    assert not log.errors, log.errors


def test_a_manifest_of_another_model_says_so(weei_server: Any, page: Any) -> None:
    pg, log = page
    open_widget(pg, weei_server.url)
    pg.get_by_label("Model module (.wasm)").set_input_files(str(MODELS / "digits-mlp" / "model.wasm"))
    pg.get_by_label("Manifest (.json)").set_input_files(str(MODELS / "cartpole-reinforce" / "manifest.json"))
    pg.get_by_role("button", name="Create job").click()
    error = pg.locator(".sec-setup .error:visible").first
    error.wait_for()
    text = error.inner_text()
    assert "this manifest is for model 'cartpole-reinforce'" in text and "'digits-mlp'" in text, text
    pg.wait_for_timeout(300)
    assert len(shown_errors(pg)) == 1, shown_errors(pg)
    assert not log.errors, log.errors


def _bars_seen(pg: Any, peer: str) -> None:
    """Record every value the coordinator's window shows on ``peer``'s bar (sampled every 50 ms)."""
    pg.evaluate("""(peer) => {
      window.barSeen = [];
      setInterval(() => {
        const bar = document.querySelector('[data-weei-widget]').shadowRoot
          .querySelector(`.sec-progress .progress[data-peer="${peer}"] [role=progressbar]`);
        if (bar) window.barSeen.push([Number(bar.getAttribute('aria-valuenow')), Number(bar.getAttribute('aria-valuemax')),
                                      bar.getAttribute('aria-valuetext') || '']);
      }, 50);
    }""", peer)


def test_remote_bars_move_and_the_participants_window_ends_in_success(weei_server: Any, browsers: Any) -> None:
    room = "test-" + uuid.uuid4().hex[:8]
    url = f"{weei_server.url}?room={room}"
    coordinator, helper = browsers(url), browsers(url)
    helper_id = helper.evaluate("T.api().getState().myPeerId")
    coordinator.evaluate("(id) => T.waitFor('the helper connected', () => T.api().getState().peers.includes(id))",
                         helper_id)
    # Only the helper trains (the coordinator does not): every bar the coordinator shows is a remote peer's.
    # 200 local epochs make each chunk take long enough for progress messages to arrive meanwhile.
    job_id = coordinator.evaluate("""async (settings) => {
      const training = T.api();
      const { wasm, manifest, files, validation } = await T.pkg('digits-mlp');
      await training.createJob({ wasm, manifest, files, validation, settings });
      training.invite(training.getState().peers[0]);
      return training.getState().job.id;
    }""", {**DIGITS, "localEpochs": 200, "coordinatorParticipates": False,
           "validationSchedule": {"enabled": True, "unit": "round", "every": 5}})
    helper.evaluate("""(jobId) => T.waitFor('the invitation', () =>
      T.api().getState().invitations.some(([id]) => id === jobId))""", job_id)
    helper.evaluate("(jobId) => T.api().decideInvitation(jobId, true)", job_id)
    for pg in (coordinator, helper):
        pg.evaluate(f"{API}.enable()")
        pg.get_by_role("dialog").wait_for()
    coordinator.evaluate("""(id) => T.waitFor('the helper loaded the model', () => {
      const p = T.api().getState().job.participants[id];
      return p && p.approved && p.state !== 'approved';
    })""", helper_id)
    _bars_seen(coordinator, helper_id)
    coordinator.evaluate("T.api().start()")
    # The helper's own window shows its training while it trains (not "waiting for assignments").
    helper.locator(f".sec-progress .progress[data-peer='{helper_id}']").first.wait_for(timeout=120_000)
    coordinator.evaluate("T.waitFor('the job to finish', () => T.done(T.api().getState()), 300000)")

    seen = coordinator.evaluate("window.barSeen")
    moving = [(v, m, t) for v, m, t in seen if 0 < v < m]
    assert moving, seen[-20:]  # part-way values: the helper's progress messages reached the coordinator
    assert all(m == 100 * 200 for _, m, _ in moving)  # a chunk's examples over every local epoch
    assert any("examples/s" in t for _, _, t in moving), moving[-3:]

    # The helper's window after completion: success, the job's checkpoints, charts with values.
    helper.locator("[data-final='success']").wait_for(timeout=30_000)
    helper.wait_for_function(
        f"() => document.querySelector('{HOST}').shadowRoot.querySelectorAll('table.checkpoints tbody tr').length >= 15")
    rounds = coordinator.evaluate("T.api().getState().job.checkpoints.length")
    assert helper.evaluate(f"document.querySelector('{HOST}').shadowRoot"
                           ".querySelectorAll('table.checkpoints tbody tr').length") == rounds
    assert helper.locator(".sec-metrics circle.pt").count() >= 2
    text = helper.locator(".sec-progress").inner_text()
    assert "Training finished" in text and "Waiting for assignments" not in text
    assert "No values yet" not in helper.locator(".sec-metrics").inner_text()
    assert "finished" in helper.locator("table.participants").inner_text()
    # Diagnostics after the end: final snapshots, not "live" or a stage of the last assignment.
    for pg in (coordinator, helper):
        table = pg.locator("table.diagnostics")
        pg.wait_for_function(f"() => document.querySelector('{HOST}').shadowRoot"
                             ".querySelector('table.diagnostics')?.innerText.includes('final')")
        text = table.inner_text()
        assert "live" not in text and "uploading" not in text and "awaitingAggregation" not in text, text


def test_a_failing_round_says_its_cause_in_the_window(weei_server: Any, page: Any) -> None:
    """A learning rate of 10^9 makes every update non-finite: the job pauses and the window says why."""
    pg, log = page
    open_widget(pg, weei_server.url)
    pg.get_by_role("button", name="Digits MLP demo").click()
    pg.get_by_text("Digits MLP demo:").wait_for()
    fill(pg, "Learning rate (optional)", "1000000000")
    pg.get_by_role("button", name="Create job").click()
    pg.get_by_role("button", name="Create anyway").click()  # the review asked first
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'ready'")
    pg.get_by_role("button", name="Start", exact=True).click()
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'paused'", timeout=180_000)
    cause = state(pg)["error"]
    assert "no valid update" in cause and "last failure from" in cause, cause
    pg.wait_for_function(f"""() => [...document.querySelector('{HOST}').shadowRoot.querySelectorAll('.error')]
        .some((e) => !e.classList.contains('hidden') && e.textContent.includes('last failure from'))""")
    errors = shown_errors(pg)
    assert len([e for e in errors if "no valid update" in e]) == 1, errors
    assert "Resume" in errors[0]
    assert not log.errors, log.errors
