"""The browser engine keeps the Engine protocol exactly as wasmtime does.

One check function (source below) runs in the page's Pyodide over
``BrowserEngine`` and in CPython over ``WasmtimeEngine``; both must report
the same observations: bulk read/write, views re-created after
``memory.grow`` (inside an export call too), the progress hook's exception
propagating unchanged, traps as ``Trap``, a forbidden import as
``InstantiateError``, bad bytes as ``CompileError``.
"""

from __future__ import annotations

import json
from typing import Any

from site_helpers import run_in_pyodide

WAT = """
(module
  (import "weei" "onProgress" (func $progress (param i32 i32)))
  (memory (export "memory") 1)
  (func (export "grow") (param i32) (result i32) (memory.grow (local.get 0)))
  (func (export "report") (param i32 i32) (result i32)
    (call $progress (local.get 0) (local.get 1))
    (i32.const 7))
  (func (export "grow_and_report") (param i32) (result i32)
    (drop (memory.grow (local.get 0)))
    (call $progress (i32.const 131077) (i32.const 3))
    (memory.size))
  (func (export "boom") (unreachable))
  (func (export "neg") (result i32) (i32.const -5))
  (func (export "nothing"))
)
"""
BAD_IMPORT_WAT = '(module (import "env" "f" (func)) (memory (export "memory") 1))'

CHECKS = r'''
def check(engine, wasm, bad_import_wasm):
    from weei.runtime.engine import CompileError, InstantiateError, Trap

    out = {}
    try:
        engine.compile(b"\0asm\x01\0\0\0garbage")
    except CompileError:
        out["compile_error"] = True
    module = engine.compile(wasm)
    out["imports"] = [[i.module, i.name, i.kind] for i in module.imports]
    out["exports"] = [[e.name, e.kind] for e in module.exports]
    try:
        engine.compile(bad_import_wasm).instantiate(lambda p, n: None)
    except InstantiateError:
        out["instantiate_error"] = True

    seen = []
    class Abort(Exception):
        pass
    abort = Abort("stop")
    mode = {"raise": False}
    inst = None

    def hook(ptr, size):
        seen.append([ptr, size, inst.read(ptr, size).hex() if size else ""])
        if mode["raise"]:
            raise abort

    inst = module.instantiate(hook)
    payload = bytes(range(256)) * 4096  # 1 MiB: grows memory first
    out["size0"] = inst.memory_size()
    inst.write(1000, b"hello")
    out["read_small"] = inst.read(1000, 5).hex()
    out["grow"] = inst.call("grow", 17)
    out["size1"] = inst.memory_size()
    inst.write(18 * 65536 - len(payload), payload)
    out["big_roundtrip"] = inst.read(18 * 65536 - len(payload), len(payload)) == payload
    out["report"] = inst.call("report", 1000, 5)
    inst.write(131077, b"abc")
    out["grown_in_call"] = inst.call("grow_and_report", 2)
    out["size2"] = inst.memory_size()
    out["seen"] = seen
    try:
        inst.read(out["size2"] - 2, 4)
    except IndexError:
        out["read_oob"] = True
    try:
        inst.write(-1, b"x")
    except IndexError:
        out["write_oob"] = True
    out["neg"] = inst.call("neg")
    out["nothing"] = inst.call("nothing")
    mode["raise"] = True
    try:
        inst.call("report", 0, 0)
    except Abort as exc:
        out["hook_exception_same"] = exc is abort
    try:
        inst.call("boom")
    except Trap:
        out["trap"] = True
    try:
        inst.call("missing")
    except Trap:
        out["missing_export"] = True
    return out
'''


def _modules() -> tuple[bytes, bytes]:
    import wasmtime

    return bytes(wasmtime.wat2wasm(WAT)), bytes(wasmtime.wat2wasm(BAD_IMPORT_WAT))


def test_browser_engine_behaves_like_wasmtime(weei_server: Any, page: Any) -> None:
    from weei.runtime import WasmtimeEngine

    wasm, bad = _modules()
    scope: dict[str, Any] = {}
    exec(CHECKS, scope)
    expected = json.loads(json.dumps(scope["check"](WasmtimeEngine(), wasm, bad)))
    assert expected["grown_in_call"] == 20 and expected["hook_exception_same"] and expected["trap"]

    pg, log = page
    pg.goto(weei_server.url)
    got = run_in_pyodide(pg, CHECKS, """
import json
from weei.browser.engine import BrowserEngine
engine = BrowserEngine()
result = json.dumps(check(engine, wasm.to_bytes(), bad.to_bytes()))
engine.close()
result""", wasm=wasm, bad=bad)
    assert json.loads(got) == expected
    assert not log.errors, log.errors


def test_closed_instance_refuses_calls(weei_server: Any, page: Any) -> None:
    wasm, _ = _modules()
    pg, _log = page
    pg.goto(weei_server.url)
    got = json.loads(run_in_pyodide(pg, "", """
import json
from weei.browser.engine import BrowserEngine
from weei.runtime.engine import Trap
engine = BrowserEngine()
inst = engine.compile(wasm.to_bytes()).instantiate(lambda p, n: None)
before = inst.call("report", 0, 0)
engine.close()
try:
    inst.call("report", 0, 0)
    after = "called"
except Trap as exc:
    after = "trap: " + str(exc)
json.dumps([before, inst.closed, after])""", wasm=wasm))
    assert got[0] == 7 and got[1] is True and got[2].startswith("trap") and "closed" in got[2]
