// Make the Pyodide memory snapshot the page starts from (build.py site runs
// this; see docs/browser.md "Start-up"). Not the Workers: Python records at
// start-up whether the runtime has stack switching (JSPI), Node 20 has not,
// and the Workers' trainGpu needs it (run_sync).
//
//   node tools/pyodide_snapshot.mjs <pyodide dir> <weei-py.zip> <out.bin>
//
// Pyodide starts in Node with _makeSnapshot, unpacks the weei package and
// imports what weei.browser's modules import (the standard library, weei's
// portable core, weei.browser itself), then writes the whole wasm memory.
// The page restores it with loadPyodide({_loadSnapshot}) instead of starting
// the interpreter and importing all of that again: those are most of
// Pyodide's start-up and all of it runs on the page's main thread.
//
// With them, the bytecode of every weei module (weei.__weei_pycache__,
// written out by boot.mjs beside the sources).
//
// Left out, imported after the restore instead: webgpu (it reads
// navigator.gpu when imported, and Node has no navigator: the snapshot
// would say "no WebGPU" for every browser) and page_main (it imports webgpu).
// What an import reads from `js` is recorded by path and looked up again in
// the page that restores the snapshot; anything else would stop
// makeMemorySnapshot with "Can't serialize object".
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [pyodideDir, zipPath, outPath] = process.argv.slice(2);
if (!outPath) {
  console.error('usage: node tools/pyodide_snapshot.mjs <pyodide dir> <weei-py.zip> <out.bin>');
  process.exit(2);
}
const indexURL = path.resolve(pyodideDir) + '/';
const { loadPyodide } = await import(pathToFileURL(indexURL + 'pyodide.mjs').href);
const pyodide = await loadPyodide({ indexURL, _makeSnapshot: true });
pyodide.unpackArchive(new Uint8Array(fs.readFileSync(zipPath)), 'zip', { extractDir: '/weei-py' });
const imported = pyodide.runPython(`
import ast, importlib, pathlib, sys
sys.path.insert(0, '/weei-py')
LATER = ('weei.browser.webgpu', 'weei.browser.page_main')
names = set()
for f in sorted(pathlib.Path('/weei-py/weei/browser').glob('*.py')):
    names.add('weei.browser.' + f.stem if f.stem != '__init__' else 'weei.browser')
    for node in ast.walk(ast.parse(f.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
names = sorted(n for n in names if n != 'js' and not n.startswith(LATER))
for name in names:
    importlib.import_module(name)
# Bytecode of every weei module, for boot.mjs to write beside the sources it
# unpacks, so what is imported after the restore is not compiled on the page
# (compiling is most of an import). Unchecked: nothing compares it with the
# source's time stamp, which is the time of unpacking.
import py_compile
_weei_pycache = {}
for f in sorted(pathlib.Path('/weei-py/weei').rglob('*.py')):
    pyc = py_compile.compile(str(f), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    _weei_pycache[pyc[len('/weei-py/'):]] = pathlib.Path(pyc).read_bytes()
sys.modules['weei'].__weei_pycache__ = _weei_pycache
len(sys.modules)
`);
const snapshot = pyodide.makeMemorySnapshot();
fs.writeFileSync(outPath, snapshot);
console.log(`${outPath}: ${snapshot.length} bytes, ${imported} modules imported`);
