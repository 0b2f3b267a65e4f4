"""weei.core.formats.jsonfmt against JavaScript's own JSON.stringify (node as the oracle)."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weei.core.errors import UsageError
from weei.core.formats.jsonfmt import descriptor, inline_file, number_to_string, stringify

NODE = shutil.which("node")

# Reads one request per line: {"value": <json with sentinels>, "indent": n};
# answers one line: JSON.stringify of the result string (so it stays on one line).
_NODE_LOOP = r"""
const rl = require('readline').createInterface({input: process.stdin});
const revive = (k, v) => v === '__NaN__' ? NaN : v === '__Inf__' ? Infinity : v === '__-Inf__' ? -Infinity : v;
rl.on('line', line => {
  const req = JSON.parse(line, revive);
  const out = JSON.stringify(req.value, null, req.indent);
  process.stdout.write(JSON.stringify(out) + '\n');
});
"""


def _to_wire(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "__NaN__" if math.isnan(value) else ("__Inf__" if value > 0 else "__-Inf__")
    if isinstance(value, list):
        return [_to_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_wire(v) for k, v in value.items()}
    return value


class NodeOracle:
    def __init__(self) -> None:
        assert NODE is not None
        self.proc = subprocess.Popen(
            [NODE, "-e", _NODE_LOOP], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, encoding="utf-8"
        )

    def stringify(self, value: Any, indent: int | None) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        # ensure_ascii: lone surrogates travel as \udXXX escapes, as JSON allows.
        line = json.dumps({"value": _to_wire(value), "indent": indent}, ensure_ascii=True)
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def node() -> Iterator[NodeOracle]:
    if NODE is None:
        pytest.skip("node is not installed")
    oracle = NodeOracle()
    yield oracle
    oracle.close()


def _same(node: NodeOracle, value: Any, indent: int | None) -> None:
    expected = node.stringify(value, indent)
    got = stringify(value, indent)
    assert got == expected
    # Byte for byte, as the hashes of inline files need.
    assert got.encode("utf-8", "surrogatepass") == expected.encode("utf-8", "surrogatepass")


FLOATS = [
    0.0, -0.0, 1.0, -1.0, 0.1, 1e21, 1e20, 1.5e21, 999999999999999900000.0, 1e-6, 1e-7, 1.5e-7, 1.2345e-6,
    123456789.125, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 0.30000000000000004, 1e16, 1e15,
    123e18, 4.35, 2**53 + 0.0, float("nan"), float("inf"), float("-inf"), -1e-300, 1e300, 100.0, 0.5,
]
INTS = [0, 1, -1, 2**31, 2**53 - 1, 2**53, 2**53 + 1, 2**64 + 123, -(2**70), 10**21, 10**22, 10**400]


@pytest.mark.parametrize("value", FLOATS + INTS)
def test_numbers_match_javascript(node: NodeOracle, value: Any) -> None:
    _same(node, value, None)
    _same(node, [value], 2)


def test_strings_escapes(node: NodeOracle) -> None:
    text = "".join(chr(i) for i in range(0, 0x80)) + "é€\u2028\u2029\ufeff\U0001f600\ud800x\udfff\ud83d\ude00\udbff"
    _same(node, text, None)
    assert stringify("\x00\x1f\x7f") == '"\\u0000\\u001f\x7f"'
    assert stringify("\ud800") == '"\\ud800"'


def test_key_order_and_empty_containers(node: NodeOracle) -> None:
    value = {"b": 1, "10": [], "2": {}, "a": {"x": []}, "01": 1, "4294967295": 0, "4294967294": 0, "-1": 2}
    for indent in (None, 0, 1, 2, 4, 10, 11, -3):
        _same(node, value, indent)
    assert stringify({"b": 1, "1": 2}) == '{"1":2,"b":1}'
    assert stringify([], 2) == "[]" and stringify({}, 2) == "{}"


def test_examples_by_hand() -> None:
    assert number_to_string(-0.0) == "0"
    assert number_to_string(1e-7) == "1e-7"
    assert number_to_string(1.5e21) == "1.5e+21"
    assert number_to_string(1e21) == "1e+21"
    assert number_to_string(123.0) == "123"
    assert stringify({"a": [1, True, None]}, 2) == '{\n  "a": [\n    1,\n    true,\n    null\n  ]\n}'
    assert stringify((1, 2.5)) == "[1,2.5]"


def test_unsupported_types_are_usage_errors() -> None:
    for bad in (object(), {1: 2}, b"x", {"a": {3.5}}):
        with pytest.raises(UsageError):
            stringify(bad)


def test_descriptor_of_spec_example() -> None:
    # The spec's empty dataset manifest: "[]" plus a newline is 3 bytes.
    assert inline_file([]) == b"[]\n"
    size, sha = descriptor([])
    assert size == 3 and sha == hashlib.sha256(b"[]\n").hexdigest()
    compat = {"schemaVersion": 1, "identity": {"modelId": "cartpole-reinforce"}, "weightCount": 114, "weightBytes": 456}
    assert descriptor(compat).bytes == len((stringify(compat, 2) + "\n").encode())


json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.floats(min_value=-1e-5, max_value=1e-5)
    | st.sampled_from([1e21, 1e-7, -0.0, 5e-324, 1e300])
    | st.text(alphabet=st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()), max_size=12)
)
json_value = st.recursive(
    json_leaf,
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(
        st.text(max_size=6) | st.integers(min_value=0, max_value=2**33).map(str), children, max_size=5
    ),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=json_value, indent=st.sampled_from([None, 0, 2, 4, 12]))
def test_fuzz_matches_javascript(node: NodeOracle, value: Any, indent: int | None) -> None:
    _same(node, value, indent)
