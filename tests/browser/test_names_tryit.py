"""Peers with names and a trained model to try (issue 24, items 9 and 14), in the built-in window.

Three tabs of one room, each in its own browser context: the coordinator names itself through the
window's name field with text that must stay text (markup, a bidirectional override); the others keep
their default "Chrome on Linux", numbered "#2" for the second by peer ID. The invitation carries the
coordinator's name; each peer's state (idle / in job X) reaches the others. After training, "Try the
model" classifies held-out digits through the model's own evaluate; a byte-transformer job completes a
prompt. Screenshots of the peers and the try-it panel at 1280, 800 and 390 px in light and dark go to
out/screenshots/names-*.png and tryit-*.png.
"""

from __future__ import annotations

import uuid
from typing import Any

from site_helpers import ROOT, TIMEOUT_MS
from test_api import DIGITS, ready

SHOTS = ROOT / "out" / "screenshots"
API = "window.weei.widgetsApi.get('distributed-training')"
SR = "document.querySelector('[data-weei-widget]').shadowRoot"
HOSTILE = "Ana's <b>laptop</b>\u202e"


def shadow(pg: Any, expr: str) -> Any:
    return pg.evaluate(f"(() => {{ const r = {SR}; return {expr}; }})()")


def shots(pg: Any, name: str, section: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    for scheme in ("light", "dark"):
        pg.emulate_media(color_scheme=scheme)
        for width, height in ((1280, 900), (800, 900), (390, 844)):
            pg.set_viewport_size({"width": width, "height": height})
            pg.wait_for_timeout(150)
            shadow(pg, f"r.querySelector('.sec-{section}').scrollIntoView()")
            pg.screenshot(path=str(SHOTS / f"{name}-{width}-{scheme}.png"))
            overflow = shadow(pg, "[r.querySelector('.body').scrollWidth, r.querySelector('.body').clientWidth]")
            assert overflow[0] <= overflow[1], f"{name} {width} px {scheme}: sideways overflow {overflow}"
    pg.emulate_media(color_scheme="light")
    pg.set_viewport_size({"width": 1280, "height": 900})


def test_names_states_and_trying_the_trained_model(weei_server: Any, browser: Any) -> None:
    room = "test-" + uuid.uuid4().hex[:8]
    url = f"{weei_server.url}?room={room}"
    pages = []
    for _ in range(3):
        pg = browser.new_context().new_page()
        pg.set_default_timeout(TIMEOUT_MS)
        ready(pg, url)
        pages.append(pg)
    coordinator, tab2, tab3 = pages
    ids = [pg.evaluate("T.api().getState().myPeerId") for pg in pages]
    coordinator.evaluate("(ids) => T.waitFor('peers and their names', () => { const s = T.api().getState();"
                         " return ids.slice(1).every((id) => s.peers.includes(id) && s.peerNames[id]); })", ids)
    errors: list[str] = []
    coordinator.on("pageerror", lambda e: errors.append(str(e)))
    coordinator.evaluate(f"{API}.enable()")
    coordinator.get_by_role("dialog").wait_for()

    # The name field: what the person types is cleaned, kept, and told to the others.
    field = coordinator.get_by_label("Your name in the room")
    field.fill(HOSTILE)
    field.dispatch_event("change")
    clean = "Ana's <b>laptop</b>"
    coordinator.evaluate("(n) => T.waitFor('the name', () => T.api().getState().displayName === n)", clean)
    tab2.evaluate("([id, n]) => T.waitFor('the others hear it', () => { const c = T.api().getState().peerNames[id];"
                  " return c && c.name === n; })", [ids[0], clean])
    labels = coordinator.evaluate("(ids) => ids.map((id) => T.api().getState().peerNames[id].label)", ids)
    second, third = sorted(ids[1:])
    assert labels[0] == clean
    assert {labels[1], labels[2]} == {"Chrome on Linux", "Chrome on Linux #2"}
    assert coordinator.evaluate("(id) => T.api().getState().peerNames[id].label", third) == "Chrome on Linux #2"
    # Shown as text: no element came out of the name, and the window says which one is this tab.
    shadow_names = shadow(coordinator, "[...r.querySelectorAll('.peername')].map((e) => [e.dataset.peerName,"
                                       " e.querySelector('b').textContent, e.querySelectorAll('b b').length])")
    assert sorted([peer, label] for peer, label, _ in shadow_names) == sorted([p, l] for p, l in zip(ids[1:], labels[1:]))
    assert all(count == 0 for _, _, count in shadow_names)
    field.blur()  # the field shows the cleaned name once the person leaves it
    coordinator.wait_for_function(f"(n) => {SR}.querySelector('[name=displayName]').value === n", arg=clean)
    assert shadow(coordinator, "[...r.querySelectorAll('.peerrow [data-field=activity]')].map((e) => e.textContent)") \
        == ["idle", "idle"]

    # A job: its coordinator is "coordinating …" for the others; the invitation says who sent it.
    job_id = coordinator.evaluate("""async (settings) => {
      const { wasm, manifest, files, validation } = await T.pkg('digits-mlp');
      await T.api().createJob({ wasm, manifest, files, validation, settings });
      return T.api().getState().job.id;
    }""", {**DIGITS, "epochs": 2, "validationSchedule": {"enabled": True, "unit": "round", "every": 1}})
    tab3.evaluate("(id) => T.waitFor('coordinating', () => T.api().getState().peerNames[id].activity === 'coordinating')",
                  ids[0])
    coordinator.evaluate("(id) => T.api().invite(id)", ids[1])
    invitation = tab2.evaluate("(jobId) => T.waitFor('the invitation', () => {"
                               " const f = T.api().getState().invitations.find(([id]) => id === jobId);"
                               " return f && f[1].invitation; })", job_id)
    assert invitation["coordinatorName"] == clean
    tab2.evaluate("(jobId) => T.api().decideInvitation(jobId, true)", job_id)
    coordinator.evaluate("(id) => T.waitFor('in the job', () => T.api().getState().peerNames[id].activity === 'training')",
                         ids[1])
    coordinator.wait_for_function(
        f"() => [...{SR}.querySelectorAll('.peerrow [data-field=activity]')].some((e) => e.textContent.startsWith('in job'))")
    shots(coordinator, "names", "peers")

    # Trained: the window tries the checkpoint on held-out digits.
    coordinator.evaluate("async () => { await T.api().start();"
                         " await T.waitFor('the job to finish', () => T.done(T.api().getState()), 180000); }")
    coordinator.wait_for_function(f"() => !{SR}.querySelector('[name=tryAnother]').closest('.hidden')")
    verdicts = []
    for _ in range(3):
        before = shadow(coordinator, "(r.querySelector('[data-field=verdict]') || {}).textContent || ''")
        shadow(coordinator, "r.querySelector('[name=tryAnother]').click()")
        coordinator.wait_for_function(
            f"(b) => {{ const v = {SR}.querySelector('[data-field=verdict]'); return v && v.textContent !== b; }}", arg=before)
        verdicts.append(shadow(coordinator, "r.querySelector('[data-field=verdict]').textContent"))
    assert all(v.startswith("Held-out image") and "The model says" in v for v in verdicts), verdicts
    out = coordinator.evaluate("() => T.api().tryCheckpoint({ example: 5 })")
    assert abs(sum(out["probabilities"]) - 1) < 1e-6 and out["round"] >= 1 and len(out["pixels"]) == 64
    assert shadow(coordinator, "r.querySelector('[name=downloadModule]').textContent") == "Download module (.wasm, no weights)"
    shots(coordinator, "tryit-digits", "tryit")
    assert not errors, errors


def test_the_transformer_completes_a_prompt(weei_server: Any, browser: Any) -> None:
    pg = browser.new_context().new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    ready(pg, weei_server.url)
    pg.evaluate("""async (settings) => {
      const { wasm, manifest, files, validation } = await T.pkg('byte-transformer');
      await T.api().createJob({ wasm, manifest, files, validation, settings });
    }""", {**DIGITS, "batchSize": 8})
    refused = pg.evaluate("() => T.rejection(() => T.api().tryCheckpoint({ prompt: 'x', maxBytes: 999 }))")
    assert refused["reason"] == "invalid-argument"
    pg.evaluate(f"{API}.enable()")
    pg.get_by_role("dialog").wait_for()
    shadow(pg, "r.querySelector('[name=tryExample]').click()")
    pg.wait_for_function(f"() => {SR}.querySelector('[data-field=completion]')", timeout=120000)
    prompt = shadow(pg, "r.querySelector('[name=tryPrompt]').value")
    assert prompt.rstrip().endswith(("=", "->")), prompt
    # Round 0 (the initial weights): the completion is whatever they say, made by the same evaluate.
    out = pg.evaluate("(p) => T.api().tryCheckpoint({ prompt: p, maxBytes: 4 })", prompt)
    assert out["round"] == 0 and 1 <= len(out["completion"]) <= 4 and out["evaluateCalls"] >= 2
    shots(pg, "tryit-text", "tryit")
