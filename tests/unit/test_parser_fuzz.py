"""Property: every parser of outside input gives a result or its named error, for any input.

The inputs are tests/fuzz/targets.py's (``make fuzz`` runs a million per
parser): structural mutations of valid samples, plus what hypothesis makes
of its own, arbitrary JSON values and arbitrary bytes. A short budget here
(``WEEI_FUZZ_EXAMPLES`` per parser, 120 by default) keeps ``make test``
fast; hypothesis is derandomized, so a run is the same every time, and has
no deadline, so a loaded machine does not fail it.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))

# The test modules whose samples targets.py borrows, imported here, outside any @given:
# importing one inside a test would apply its @given decorators there (a nested-given error).
import test_diagnostics  # noqa: E402, F401
import test_gpu_program  # noqa: E402, F401
import test_messages  # noqa: E402, F401
import test_parser_hostile  # noqa: E402, F401
from targets import TARGETS, Target, check, generate  # noqa: E402

settings.register_profile(
    "parsers",
    max_examples=int(os.environ.get("WEEI_FUZZ_EXAMPLES", "120")),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    database=None,
)
PARSERS = settings.get_profile("parsers")

_BUILT: dict[str, Target] = {}


def target(name: str) -> Target:
    if name not in _BUILT:
        _BUILT[name] = TARGETS[name]()
    return _BUILT[name]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)


INPUTS = st.one_of(
    st.integers(min_value=0, max_value=2**64).map(lambda seed: ("mutated", seed)),  # the fuzzer's own generator
    JSON.map(lambda value: ("json", value)),
    st.binary(max_size=200).map(lambda data: ("bytes", data)),
)


def _input(t: Target, drawn: tuple[str, Any]) -> Any:
    """The drawn input in the form the target takes (bytes, or a value)."""
    kind, value = drawn
    if kind == "mutated":
        return generate(t, random.Random(value))
    if kind == "json":
        return value if t.kind == "value" else json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return value if t.kind == "bytes" else value.decode("latin-1")


@pytest.mark.parametrize("name", list(TARGETS))
def test_valid_samples_are_parsed(name: str) -> None:
    # The mutations start from samples the parser takes (model-result's error sample is refused by name).
    t = target(name)
    for data in t.samples:
        assert check(t, data) is None


@pytest.mark.parametrize("name", list(TARGETS))
@PARSERS
@given(drawn=INPUTS)
def test_only_named_errors_come_out(name: str, drawn: tuple[str, Any]) -> None:
    t = target(name)
    error = check(t, _input(t, drawn))
    assert error is None, f"{name} let {type(error).__name__} out: {error}"


def test_the_oracle_catches_an_unnamed_error() -> None:
    # A target that raises KeyError is caught, and one that builds a named error without a reason is
    # too: that error cannot be built (its constructor takes only a member of its reason enum).
    from weei.core.errors import WeeiError

    def broken(data: bytes) -> None:
        raise {}["x"]

    assert isinstance(check(Target("t", broken, (WeeiError,), [b"{}"], lambda r, d: d), b"{}"), KeyError)
    no_reason = Target("t", lambda d: (_ for _ in ()).throw(WeeiError("", "m")), (WeeiError,), [b"{}"], lambda r, d: d)
    assert isinstance(check(no_reason, b"{}"), TypeError)


def test_generation_is_seeded() -> None:
    t = target("checkpoint")
    first = [generate(t, random.Random(f"0:checkpoint:{k}")) for k in range(20)]
    again = [generate(t, random.Random(f"0:checkpoint:{k}")) for k in range(20)]
    assert first == again and len(set(first)) > 10
