"""The window's feedback (issue 12): settings that need a confirmation, one error surface, the
other-model manifest message, a failed round's cause, live progress of remote peers and the
participant's window after completion."""

from __future__ import annotations

from typing import Any

from site_helpers import ROOT
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
    if not pg.get_by_label("Learning rate (optional)", exact=True).is_visible():
        pg.locator("details.settings summary").click()  # the form folds away once a job exists
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
