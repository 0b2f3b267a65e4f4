"""The widget's settings form offers privacy (docs/privacy.md): secure aggregation and differential privacy.

The form logic on one page: the Privacy fields show only with their checkbox, the planned ε is the core's
(reviewSettings) and follows σ as it is typed, a combination the core refuses shows its refusal by name
before Create job, nothing is sent when the section is left off, and a job's saved privacy fills the form
back (so Apply settings sends what the job was created with).

End to end, like people, in a room of three browsers (secure aggregation needs two contributors a round:
the coordinator trains too, and two participant pages): the owner creates a digits-mlp job from the form
with secure aggregation and DP noise added by the participants; a participant's invitation card states the
terms and the planned ε the form showed; the job runs to its DP round limit, the progress line shows ε spent
and that the participants added the noise, and the downloaded checkpoint's metadata say so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from playwright.sync_api import expect
from room_helpers import INVITE, WAIT_INVITATION, WAIT_LOADED, explained, join_room
from site_helpers import TIMEOUT_MS
from test_api import ready
from test_widget import API, HOST, fill, open_widget, state
from test_widget_look import AXE

from weei.core.formats.checkpoint import read_checkpoint
from weei.core.privacy.dp_accountant import epsilon_after

SR = f"document.querySelector('{HOST}').shadowRoot"


def test_the_privacy_fields_their_refusal_and_planned_epsilon(weei_server: Any, page: Any) -> None:
    pg, log = page
    open_widget(pg, weei_server.url)
    pg.get_by_role("button", name="Digits MLP demo").click()
    pg.get_by_text("Digits MLP demo:").wait_for()
    secure = pg.get_by_label("Secure aggregation", exact=True)
    dp = pg.get_by_label("Differential privacy", exact=True)
    clip, sigma = pg.get_by_label("Participant clip (L2 norm)", exact=True), pg.get_by_label("Noise multiplier σ (0–1000)", exact=True)
    noise_at = pg.get_by_label("Noise added by", exact=True)
    assert not clip.is_visible() and not sigma.is_visible() and not noise_at.is_visible()

    # Ticked and left again: nothing is sent (the settings are those of a form without the section).
    secure.check()
    dp.check()
    expect(sigma).to_be_visible()
    assert not clip.is_visible()  # with DP on, participants clip to the DP clip
    secure.uncheck()
    dp.uncheck()
    pg.get_by_role("button", name="Create job").click()
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'ready'")
    assert state(pg)["job"]["settings"] == {
        "epochs": 1, "localEpochs": 1, "batchSize": 32, "coordinatorParticipates": True,
        "validationSchedule": {"enabled": True, "unit": "round", "every": 1}}
    pg.evaluate(f"{API}.leave()")  # the form is free for the next job
    pg.wait_for_function(f"() => !{API}.getState().job")
    expect(pg.get_by_role("button", name="Create job")).to_be_visible(timeout=TIMEOUT_MS)
    pg.evaluate(f"{SR}.querySelector('details.settings').open = true")  # folded when the job was created
    secure.check()
    expect(clip).to_be_visible()

    # The core's refusal, by name, at once: secure aggregation cannot run a robust combine.
    pg.get_by_label("Combine", exact=True).select_option("median")
    form_error = pg.locator(".sec-setup .actions .error")
    expect(form_error).to_contain_text("settings.privacy.secureAggregation", timeout=TIMEOUT_MS)
    expect(form_error).to_contain_text("conflicting-setting")
    create = pg.get_by_role("button", name="Create job")
    create.click()
    expect(create).to_be_enabled(timeout=TIMEOUT_MS)  # the action is over
    expect(form_error).to_contain_text("settings.privacy.secureAggregation")
    assert "job" not in state(pg)
    pg.get_by_label("Combine", exact=True).select_option("mean")
    expect(form_error).to_be_hidden(timeout=TIMEOUT_MS)

    # Noise at the participants is offered only with secure aggregation on.
    dp.check()
    options = "(s) => [...s.querySelector('select[name=noiseAt]').options].map((o) => o.disabled)"
    assert pg.evaluate(f"({options})({SR})") == [False, False]
    noise_at.select_option("participants")
    # The planned ε is the core's accountant's (reviewSettings), and follows σ as it is typed.
    expect(pg.locator("[data-field=plannedEpsilon]")).to_contain_text(
        f"Planned ε ≤ {epsilon_after(1.1, 30, 1e-5):.3g} at δ 0.00001 over at most 30 rounds", timeout=TIMEOUT_MS)
    sigma.fill("4")  # an input event, no change
    expect(pg.locator("[data-field=plannedEpsilon]")).to_contain_text(f"ε ≤ {epsilon_after(4, 30, 1e-5):.3g} ",
                                                                      timeout=TIMEOUT_MS)
    secure.uncheck()
    assert pg.evaluate(f"({options})({SR})") == [False, True] and noise_at.input_value() == "coordinator"
    secure.check()
    noise_at.select_option("participants")

    # The accessibility check (test_widget_look's axe-core) with the privacy fields shown.
    pg.evaluate(AXE.read_text())
    bad = pg.evaluate(f"""axe.run({SR}.querySelector('.privacy'), {{ resultTypes: ['violations'] }})
      .then((r) => r.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical')
        .map((v) => [v.id, v.nodes.map((n) => n.target)]))""")
    assert not bad, bad

    pg.get_by_role("button", name="Create job").click()
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'ready'")
    assert state(pg)["job"]["settings"]["privacy"] == {
        "secureAggregation": True, "threshold": 0.6,
        "dp": {"clip": 1, "noiseMultiplier": 4, "delta": 1e-5, "maxRounds": 30, "noiseAt": "participants"}}
    assert not log.errors, log.errors


def test_a_saved_jobs_privacy_fills_the_form_back(weei_server: Any, page: Any) -> None:
    pg, log = page
    ready(pg, weei_server.url)
    privacy = {"secureAggregation": True, "clip": 2.5, "threshold": 0.75}
    pg.evaluate("""async (privacy) => {
      const { wasm, manifest, files } = await T.pkg('digits-mlp');
      await T.api().createJob({ wasm, manifest, files, settings: { epochs: 1, localEpochs: 1, batchSize: 16,
        coordinatorParticipates: true, privacy } });
    }""", privacy)
    pg.evaluate(f"{API}.enable()")
    pg.get_by_role("dialog").wait_for()
    pg.locator(".sec-setup details.settings > summary").click()  # folded once a job exists
    assert pg.get_by_label("Secure aggregation", exact=True).is_checked()
    assert pg.get_by_label("Participant clip (L2 norm)", exact=True).input_value() == "2.5"
    assert pg.get_by_label("Threshold (0.5–1)", exact=True).input_value() == "0.75"
    assert not pg.get_by_label("Differential privacy", exact=True).is_checked()
    # The job's privacy cannot change (docs/api.md): Apply goes through only because the form sends it back.
    fill(pg, "Batch size", "20")
    pg.get_by_role("button", name="Apply settings to job").click()
    pg.wait_for_function(f"() => {API}.getState().job?.settings?.batchSize === 20")
    assert state(pg)["job"]["settings"]["privacy"] == privacy
    assert not pg.locator(".sec-setup .actions .error").is_visible()
    assert not log.errors, log.errors


def test_a_job_with_participant_noise_created_from_the_widget(weei_server: Any, browsers: Any,
                                                              tmp_path: Path) -> None:
    room = join_room(weei_server.url, browsers, 2)
    owner, first, second = room.coordinator, *room.participants
    owner.evaluate(f"{API}.enable()")
    owner.get_by_role("dialog").wait_for()
    owner.get_by_role("button", name="Digits MLP demo").click()
    owner.get_by_text("Digits MLP demo:").wait_for()
    fill(owner, "Batch size", "16")
    owner.get_by_label("Secure aggregation", exact=True).check()
    owner.get_by_label("Differential privacy", exact=True).check()
    # Two rounds under DP keep the job short (it ends there: ε stays within the plan).
    fill(owner, "DP clip (L2 norm)", "1")
    fill(owner, "Noise multiplier σ (0–1000)", "0.5")
    fill(owner, "Rounds under DP (at most)", "2")
    owner.get_by_label("Noise added by", exact=True).select_option("participants")
    epsilon = f"{epsilon_after(0.5, 2, 1e-5):.3g}"
    expect(owner.locator("[data-field=plannedEpsilon]")).to_have_text(
        f"Planned ε ≤ {epsilon} at δ 0.00001 over at most 2 rounds", timeout=TIMEOUT_MS)
    owner.get_by_role("button", name="Create job", exact=True).click()
    owner.wait_for_function(f"() => {API}.getState().job?.status === 'ready'")
    job_id = owner.evaluate(f"{API}.getState().job.id")
    with explained(room.tabs()):
        owner.evaluate(INVITE, room.ids)

    # The first participant reads the card in its window and accepts there; the second through the API.
    first.evaluate(f"{API}.enable()")
    first.get_by_role("dialog").wait_for()
    first.get_by_role("button", name="Review", exact=True).click()
    card = first.locator(".card.invitation [data-field=privacy]")
    expect(card).to_contain_text("secure aggregation: the coordinator sees only the sum (your update clipped to 1; "
                                 "threshold 0.6)", timeout=TIMEOUT_MS)
    expect(card).to_contain_text(f"differential privacy ε ≤ {epsilon} at δ 0.00001 over at most 2 rounds (clip 1, "
                                 "noise ×0.5, added by each participant to its masked update)")
    first.get_by_role("button", name="Accept", exact=True).click()
    with explained(room.tabs()):
        second.evaluate(WAIT_INVITATION, job_id)
        second.evaluate("(jobId) => T.api().decideInvitation(jobId, true)", job_id)
        owner.evaluate(WAIT_LOADED, [room.ids, 120_000])

    start = owner.get_by_role("button", name="Start", exact=True)
    expect(start).to_be_enabled(timeout=TIMEOUT_MS)
    start.click()
    with explained(room.tabs()):
        owner.wait_for_function(f"() => {API}.getState().job?.status === 'completed'", timeout=300_000)

    events = owner.evaluate(f"{API}.getDebugLog().events")
    names = [e["event"] for e in events]
    assert "update.accepted" not in names and names.count("secagg.finished") == 2, names
    line = owner.locator(".sec-progress [data-field=privacy]")
    expect(line).to_contain_text(f"spent of {epsilon} planned at δ 0.00001 · 2 / 2 rounds · noise added by the "
                                 "participants", timeout=TIMEOUT_MS)
    spent = owner.evaluate(f"{API}.getState().job.privacy.dp.epsilon")
    assert f"ε {spent:.3g} spent" in line.inner_text()

    with owner.expect_download() as download:
        owner.get_by_role("button", name="Download latest checkpoint").click()
    path = tmp_path / "latest.weei-checkpoint"
    download.value.save_as(path)
    meta = read_checkpoint(path.read_bytes()).metadata.to_json()
    assert meta["round"] == 2 and meta["privacy"]["dp"]["noiseAt"] == "participants", meta.get("privacy")
    assert meta["privacy"]["dp"]["rounds"] == 2
    assert meta["settings"]["privacy"]["dp"]["noiseAt"] == "participants"
