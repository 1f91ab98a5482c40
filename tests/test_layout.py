"""The house's layout, read from the source (docs/contributing.md, "The layout: folders as floors"):
no import circle (imports inside functions included), each folder importing only the floors below it,
models off the deploy and training packages, an engine that names no component, and a reason beside
every import made inside a function."""
import ast
import io
import os
import re
import tokenize

from engine.components import ENGINE_MODULES, component_modules, load_all
from engine.registry import DATASETS, METRICS, MODELS, OUTPUTS, TRANSFORMS
from tests.helpers import ROOT

# every folder of ours with Python in it; tools/ and tests/ are folders of scripts, their modules
# are imported by bare name (tools put themselves on sys.path, the tests import tools/*.py so too)
PACKAGES = ("api", "benchmarks", "data", "deploy", "engine", "metrics", "models", "ops", "outputs", "readers", "serving")
SCRIPTS = ("tools",)
FOLDERS = PACKAGES + SCRIPTS + ("tests",)


def _sources(root, folders=FOLDERS):
    """(dotted module name, path) of every .py file under `folders` of `root`."""
    for top in folders:
        for folder, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, root)[:-3].split(os.sep)
                if top in SCRIPTS:
                    parts = parts[1:]   # `import _bootstrap`, `import benchmark`
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                yield ".".join(parts), path


def _imports(path, module, is_package, inside_functions=None):
    """(line, imported module name) of each import statement of a file; relative imports resolved.
    `inside_functions`: only those inside (True) or outside (False) a function; None: all."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)

    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)) and inside_functions in (None, in_function):
                yield child, in_function
            yield from walk(child, inner)

    for node, _ in walk(tree, False):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        else:
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[:len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            yield node.lineno, base, [a.name for a in node.names]


def import_graph(root, folders=FOLDERS):
    """{module: {modules it imports}} among the modules under `root`, imports inside functions
    included; `from a import b` is an edge to a.b where that is a module of ours, else to a."""
    sources = dict(_sources(root, folders))
    graph = {}
    for module, path in sources.items():
        edges = graph.setdefault(module, set())
        for _, name, names in _imports(path, module, path.endswith("__init__.py")):
            targets = [f"{name}.{n}" for n in names if f"{name}.{n}" in sources] or [name]
            edges.update(t for t in targets if t in sources and t != module)
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                found.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_among_our_modules_imports_inside_functions_included():
    graph = import_graph(ROOT)
    assert len(graph) > 150 and sum(map(len, graph.values())) > 500   # the walk sees the project
    assert graph["deploy.predictor"] >= {"deploy.record", "deploy.onnx"}
    assert cycles(graph) == []


def test_the_circle_walk_finds_a_circle_closed_inside_a_function(tmp_path):
    """The walk above can fail: a circle closed by an import inside a function, as export -> onnx ->
    predictor -> export was (and a relative import)."""
    pkg = tmp_path / "deploy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "export.py").write_text("from deploy import onnx\n")
    (pkg / "onnx.py").write_text("def run():\n    from .predictor import checked_feeds\n")
    (pkg / "predictor.py").write_text("import os\n\ndef f():\n    from deploy.export import x\n")
    (pkg / "record.py").write_text("import deploy.export\n")
    graph = import_graph(str(tmp_path), ("deploy",))
    assert cycles(graph) == [["deploy.export", "deploy.onnx", "deploy.predictor"]]


# docs/contributing.md, "The layout: folders as floors": what each folder may import of ours
FLOORS = {"ops": set(), "engine": {"ops"}, "readers": {"engine"}, "models": {"engine", "ops"},
          "metrics": {"engine", "readers"}, "outputs": {"engine", "metrics", "readers"},
          "benchmarks": {"engine", "ops", "readers", "data"}, "data": {"engine", "readers", "outputs"},
          "serving": {"api", "engine"}}


def test_each_folder_imports_only_the_floors_the_contributing_guide_gives_it():
    """Imports inside functions count too; the table says no more than the code does."""
    ours = set(FOLDERS) | {"_bootstrap"}
    for pkg, allowed in FLOORS.items():
        seen = set()
        for module, path in _sources(ROOT, (pkg,)):
            for line, name, _ in _imports(path, module, path.endswith("__init__.py")):
                top = {name.split(".")[0]} & ours - {pkg}
                assert top <= allowed, f"{os.path.relpath(path, ROOT)}:{line} imports {name}"
                seen |= top
        assert seen == allowed, (pkg, seen)


# who may import the folders on top (tools' modules by bare name, `_bootstrap` among them)
ENTRY_IMPORTERS = {"tests": set(), "tools": {"tools"}, "_bootstrap": {"tools"}, "api": {"api", "tools", "serving"},
                   "benchmarks": {"benchmarks", "tools"}, "serving": {"serving", "tools"}}


def test_nothing_below_the_entry_points_imports_them():
    """tools/, serving/ and api/ sit on top: nothing of ours imports the tests or the tools; api/ (the
    inferencer) by api/ itself, the tools and the server's model process (serving/worker.py); serving/ by
    itself and tools/serve.py; only tools/ import benchmarks/ besides benchmarks/ itself."""
    for folder in PACKAGES + SCRIPTS:
        for module, path in _sources(ROOT, (folder,)):
            for line, name, _ in _imports(path, module, path.endswith("__init__.py")):
                importers = ENTRY_IMPORTERS.get(name.split(".")[0], {folder})
                assert folder in importers, f"{os.path.relpath(path, ROOT)}:{line} imports {name}"


def test_models_import_no_deploy_or_training_module():
    """What a model needs to run its exported programs is in the model contract (engine/model.py)."""
    found = 0
    for module, path in _sources(ROOT, ("models",)):
        for line, name, names in _imports(path, module, path.endswith("__init__.py")):
            full = [name] + [f"{name}.{n}" for n in names]
            assert not any(re.match(r"engine\.(deploy|training)\b", m) for m in full), \
                f"{os.path.relpath(path, ROOT)}:{line} imports {name}"
            found += name.startswith("engine")
    assert found > 20


def engine_mentions(root, names, paths):
    """(file:line, token) of each identifier or string literal (docstrings aside: prose may cite a
    model as the source of a figure) under engine/ and deploy/ (which runs any model's export the
    same way) that names one of `names` (whole word) or a dotted or slashed module path of `paths`."""
    word = re.compile(r"\b(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")\b")
    path = re.compile(r"\b(" + "|".join(re.escape(p).replace(r"\.", r"[./]") for p in paths) + r")\b")
    hits = []
    for module, file in _sources(root, ("engine", "deploy")):
        text = open(file, encoding="utf-8").read()
        lines_of_docstrings = set()
        for node in ast.walk(ast.parse(text)):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                    and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                lines_of_docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.NAME or (tok.type == tokenize.STRING and tok.start[0] not in lines_of_docstrings):
                for m in list(word.finditer(tok.string)) + list(path.finditer(tok.string)):
                    hits.append((f"{os.path.relpath(file, root)}:{tok.start[0]}", m.group(0)))
    return hits


def test_the_engine_names_no_component():
    """No code under engine/ or deploy/ names a registered model, reader, transform, metric or output writer, or
    the module of one: the engine finds them through the packages' COMPONENTS declarations. The
    engine's own samplers, collates, optimizers and LR schedules are its business."""
    load_all()
    names = set()
    for registry in (MODELS, DATASETS, TRANSFORMS, METRICS, OUTPUTS):
        names |= set(registry.names())
    paths = [m for m in component_modules() if m not in ENGINE_MODULES]
    assert len(names) > 40 and len(paths) > 30
    assert engine_mentions(ROOT, names, paths) == []
    # the scan can fail: it sees a model name in a message and a module path in a string
    assert engine_mentions(ROOT, names | {"world_size"}, paths)
    assert engine_mentions(ROOT, names, paths + ["deploy.onnx"])   # a child process it starts


def _reason(lines, lineno):
    """The comment that says why an import at `lineno` (1-based) is inside a function: on its line,
    or on the comment line directly above the block of import lines it belongs to."""
    if "#" in lines[lineno - 1]:
        return lines[lineno - 1].split("#", 1)[1].strip()
    i = lineno - 2
    while i >= 0 and re.match(r"\s*(from \S+ import|import )", lines[i]) and "#" not in lines[i]:
        i -= 1
    line = lines[i].strip() if i >= 0 else ""
    if line.startswith("#"):
        return line[1:].strip()
    if i >= 0 and re.match(r"\s*(from \S+ import|import )", lines[i]) and "#" in lines[i]:
        return lines[i].split("#", 1)[1].strip()
    return ""


def _folder_of(root, name):
    """The folder (relative to `root`) of the module `name`: its own for a package; tools/ for a bare name."""
    parts = name.split(".")
    if os.path.isdir(os.path.join(root, *parts)):
        return os.path.join(*parts)
    return os.path.join(*parts[:-1]) if len(parts) > 1 else "tools"


def function_level_imports(root, folders):
    """(file:line, module, reason) of each import inside a function of a module of ours that lives in
    another folder than the importing file."""
    out = []
    for module, path in _sources(root, folders):
        lines = open(path, encoding="utf-8").read().splitlines()
        here = os.path.dirname(os.path.relpath(path, root))
        for line, name, names in _imports(path, module, path.endswith("__init__.py"), inside_functions=True):
            if name.split(".")[0] in set(FOLDERS) | {"_bootstrap"} and _folder_of(root, name) != here:
                out.append((f"{os.path.relpath(path, root)}:{line}", name, _reason(lines, line)))
    return out


def test_every_import_inside_a_function_says_why():
    """Outside the tests, an import of another folder of ours inside a function stays there only for
    a reason given beside it (import cost, an optional dependency, a child process, ...)."""
    found = function_level_imports(ROOT, PACKAGES + SCRIPTS)
    assert found   # the tools import paddle's side after parsing their flags
    assert [f"{where} {name}" for where, name, why in found if not why] == []


def test_every_import_inside_a_function_outside_the_tests_says_why():
    """Not only ours from another folder: every import inside a function outside tests/ (the standard
    library's and third-party packages' too) stays there only with its reason beside it."""
    found, missing = 0, []
    for module, path in _sources(ROOT, PACKAGES + SCRIPTS):
        where = os.path.relpath(path, ROOT).replace(os.sep, "/")
        lines = open(path, encoding="utf-8").read().splitlines()
        for line, name, _ in _imports(path, module, path.endswith("__init__.py"), inside_functions=True):
            found += 1
            if not _reason(lines, line):
                missing.append(f"{where}:{line} {name}")
    assert found > 20   # optional packages (onnx...), and the tools' imports after parsing their flags
    assert missing == []
