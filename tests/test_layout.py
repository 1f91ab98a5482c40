"""The house's layout, read from the source and from docs/contributing.md's table ("The layout: folders
as floors"): no import circle (imports inside functions included), each folder importing exactly the
folders its row draws, on its floor or below, training reaching no deploy module, models off the deploy
and training packages, an engine that names no component, and a reason beside every import made inside
a function."""
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
PACKAGES = ("api", "benchmarks", "data", "deploy", "engine", "metrics", "models", "ops", "outputs", "readers",
            "serving")
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


LAYOUT_DOC = os.path.join(ROOT, "docs", "contributing.md")
LAYOUT_HEADING = "## The layout: folders as floors"


def layout_table(doc=LAYOUT_DOC):
    """{folder: (floor, the folders of ours its row says it imports; None for "any")} from the table
    under `LAYOUT_HEADING` of `doc` (columns: floor, folder, what it holds, imports of ours)."""
    text = open(doc, encoding="utf-8").read()
    section = ("\n" + text).split("\n" + LAYOUT_HEADING + "\n", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("|")]
    header = rows[0]
    table = {}
    for cells in rows[2:]:
        row = dict(zip(header, cells))
        folder = re.fullmatch(r"`(\w+)/`", row["folder"])
        assert folder, f"{doc}: the layout table's folder cell {row['folder']!r} is not `name/`"
        imports = row["imports of ours"]
        drawn = None if imports == "any" else set() if imports == "nothing" else set(imports.split(", "))
        table[folder.group(1)] = (int(re.match(r"\d+", row["floor"]).group()), drawn)
    return table


def folder_imports(root, folders=FOLDERS):
    """{folder: {folder of ours it imports: the first file:line that does}}, imports inside functions
    included; a tools module imported by its bare name (`import _bootstrap`) is tools/'s."""
    tool_modules = {m for m, _ in _sources(root, SCRIPTS)}
    out = {}
    for folder in folders:
        seen = out.setdefault(folder, {})
        for module, path in _sources(root, (folder,)):
            for line, name, _ in _imports(path, module, path.endswith("__init__.py")):
                top = name.split(".")[0]
                top = "tools" if top in tool_modules else top
                if top in folders and top != folder:
                    seen.setdefault(top, f"{os.path.relpath(path, root)}:{line} imports {name}")
    return out


def layout_differences(root, doc=LAYOUT_DOC, folders=FOLDERS):
    """Where the layout table of `doc` and the imports of the code under `root` disagree, one line each:
    a folder without its row, an import the table does not draw, an arrow the code does not have, an
    import of a higher floor."""
    table, real = layout_table(doc), folder_imports(root, folders)
    out = [f"{f}/ has no row in the layout table" for f in folders if f not in table]
    out += [f"the layout table names {f}/, which is not a folder of ours" for f in table if f not in folders]
    for folder, seen in sorted(real.items()):
        floor, drawn = table.get(folder, (None, None))
        for target, where in sorted(seen.items()):
            if drawn is not None and target not in drawn:
                out.append(f"{where}: the layout table does not draw {folder}/ -> {target}/")
            if floor is not None and target in table and table[target][0] > floor:
                out.append(f"{where}: {folder}/ (floor {floor}) imports a higher floor, {target}/ "
                           f"({table[target][0]})")
        for target in sorted((drawn or set()) - set(seen)):
            out.append(f"the layout table draws {folder}/ -> {target}/, which no import of {folder}/ makes")
    return out


def test_the_layout_table_of_the_contributing_guide_draws_the_imports_of_the_code():
    """docs/contributing.md's table lists each folder of ours and exactly the folders it imports
    (imports inside functions count), each on its floor or below: both ways, an import the table
    lacks and an arrow the code lacks fail."""
    table = layout_table()
    assert set(table) == set(FOLDERS) and table["tests"][1] is None and table["ops"][1] == set()
    assert table["engine"][1] == {"ops"} and "engine" in table["deploy"][1]   # deploy sits above the engine
    assert layout_differences(ROOT) == []


def test_the_layout_check_fails_both_ways(tmp_path):
    """The comparison above can fail: an import the table does not draw (inside a function too), an
    arrow no import makes, an import of a higher floor, a folder without its row."""
    doc = tmp_path / "layout.md"
    doc.write_text(f"{LAYOUT_HEADING}\n\n| floor | folder | what it holds | imports of ours |\n|---|---|---|---|\n"
                   "| 3 | `top/` | x | low |\n| 2 | `mid/` | x | low |\n| 1 | `low/` | x | nothing |\n\n## next\n")
    for folder, source in (("top", "import low.a\n"), ("mid", "def f():\n    import top.b\n"), ("low", ""),
                           ("extra", "")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text(source)
    assert layout_differences(str(tmp_path), str(doc), ("top", "mid", "low", "extra")) == [
        "extra/ has no row in the layout table",
        "mid/__init__.py:2 imports top.b: the layout table does not draw mid/ -> top/",
        "mid/__init__.py:2 imports top.b: mid/ (floor 2) imports a higher floor, top/ (3)",
        "the layout table draws mid/ -> low/, which no import of mid/ makes"]


def reached(graph, roots):
    """{module: the module whose import reached it} of everything importing `roots` loads: each import
    of each module reached (inside functions too) and the packages above it."""
    parents, todo = {r: None for r in roots if r in graph}, [r for r in roots if r in graph]
    while todo:
        module = todo.pop()
        parts = module.split(".")
        for nxt in [".".join(parts[:i]) for i in range(1, len(parts))] + sorted(graph[module]):
            if nxt in graph and nxt not in parents:
                parents[nxt] = module
                todo.append(nxt)
    return parents


def chains_to(parents, prefix):
    """"a -> b -> c" for each module reached whose name is `prefix` or under it."""
    out = []
    for module in sorted(m for m in parents if m == prefix or m.startswith(prefix + ".")):
        chain = [module]
        while parents[chain[-1]] is not None:
            chain.append(parents[chain[-1]])
        out.append(" -> ".join(reversed(chain)))
    return out


def test_training_imports_no_deployment_module():
    """tools/train.py and tools/launch.py (as `train` and `launch`, with what they import),
    engine/training/trainer.py and the component modules the Session's load_all() imports at run time
    reach no module of deploy/: training loads no inference backend. Imports inside functions count
    (the walk cannot tell which ones run)."""
    graph = import_graph(ROOT)
    roots = ["train", "launch", "engine.training.trainer", "engine.session"] + list(ENGINE_MODULES) \
        + component_modules()
    parents = reached(graph, roots)
    assert {"_bootstrap", "engine.session", "engine.training.evaluator", "models.vision.deeplabv3"} <= set(parents)
    assert chains_to(parents, "deploy") == []


def test_the_training_walk_finds_a_deployment_import_inside_a_function(tmp_path):
    """The walk above can fail: the trainer imports the Session, which imports a deploy module inside a
    function; the chain names each step."""
    for folder, files in (("engine", {"__init__.py": "", "session.py": "def f():\n    from deploy import load\n",
                                      "training/__init__.py": "",
                                      "training/trainer.py": "from engine.session import f\n"}),
                          ("deploy", {"__init__.py": "", "load.py": "import os\n"})):
        for name, text in files.items():
            (tmp_path / folder / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / folder / name).write_text(text)
    parents = reached(import_graph(str(tmp_path), ("engine", "deploy")), ["engine.training.trainer"])
    assert chains_to(parents, "deploy") == ["engine.training.trainer -> engine.session -> deploy.load -> deploy",
                                            "engine.training.trainer -> engine.session -> deploy.load"]


def test_models_import_no_deploy_or_training_module():
    """What a model needs to run its exported programs is in the model contract (engine/model.py)."""
    found = 0
    for module, path in _sources(ROOT, ("models",)):
        for line, name, names in _imports(path, module, path.endswith("__init__.py")):
            full = [name] + [f"{name}.{n}" for n in names]
            assert not any(re.match(r"(deploy|engine\.training)\b", m) for m in full), \
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
