"""docs/contributing.md's checklist for adding a model, checked on every registered model.

The page's list and CHECKS below are one thing: each item's key names its check, an item without a
check or a check without an item fails, and a model that misses a piece fails with the item's text.
Cheap on purpose (files, registries and models built under paddle.LazyGuard(), no training): the
tests each item names run the demos, exports and generators themselves; this one sees that every
model is in their reach.
"""
import ast
import dataclasses
import functools
import glob
import importlib.util
import inspect
import json
import os
import re
import sys
import textwrap
import types

import paddle
import pytest
import yaml

from engine import builder, config
from engine.components import ENGINE_MODULES, component_modules, load_all
from engine.model import ZooModel
from engine.registry import MODELS
from engine.weights.pretrained import WEIGHTS
from tests.helpers import ROOT

DOC = os.path.join(ROOT, "docs", "contributing.md")
SECTION = "## Adding a model: the checklist"
# the two lists of the section, by the heading each sits under
SCOPES = {"### Every registered model": "every", "### A model with recipes": "recipes"}
# demos the quantization test leaves out, and why (the item's own words)
NOT_QUANTIZED = {"configs/nlp/bert/bert_pretrain_demo.yaml": "a pretraining demo, deployed through the models "
                                                              "fine-tuned from it"}


# ---------------------------------------------------------------- the page's list
def checklist(text):
    """{key: (scope, item text)} of the checklist section of `text`, in page order. An item is a line
    `- **`key`**: text` under one of SCOPES' headings, its text going on over the indented lines."""
    if text.count(SECTION + "\n") != 1:
        raise AssertionError(f"{DOC}: no section {SECTION!r}")
    body = text.split(SECTION + "\n", 1)[1].split("\n## ", 1)[0]
    items, scope, current = {}, None, None
    for line in body.splitlines():
        if line.startswith("### "):
            scope, current = SCOPES.get(line.strip(), f"unknown list {line.strip()!r}"), None
            continue
        m = re.match(r"- \*\*`([\w-]+)`\*\*: (.*)", line)
        if m:
            if m.group(1) in items:
                raise AssertionError(f"{DOC}: checklist item {m.group(1)} twice")
            current = m.group(1)
            items[current] = (scope, m.group(2).strip())
        elif current and line.startswith("  ") and line.strip():
            items[current] = (items[current][0], items[current][1] + " " + line.strip())
        else:
            current = None
    return items


# ---------------------------------------------------------------- what the checks read
def _tree(path):
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), path)


def _assigned(tree, name):
    """The value node of the module-level assignment `name = ...`."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value
    raise AssertionError(f"no module-level {name} = ... found")


def _function(tree, name):
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def _tool(name):
    """tools/<name>.py as a module (its own directory on sys.path, as it runs)."""
    tools = os.path.join(ROOT, "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    spec = importlib.util.spec_from_file_location(f"checklist_tool_{name}", os.path.join(tools, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _section(text, heading):
    """The lines of `text` from the line `heading` to the next heading."""
    lines = text.splitlines()
    if heading not in lines:
        return None
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("#")), len(lines))
    return lines[start:end]


# `from a import b, c`, `from a import (b,\n c)`, `import a, b as c`
IMPORT = re.compile(r"^\s*from ([\w.]+) import (?:\(([^)]*)\)|([^\n#]+))|^\s*import ([\w., ]+)", re.M)
_LOADED, _BUILT = {}, {}   # the tree's recipes, loaded and built once for every Project of the session


@dataclasses.dataclass
class Project:
    """What the checks read: the recipes (those under configs/, plus `extra_recipes`, less those `hide`
    rejects) and the repository's files. A test hands a Project with a piece taken away."""
    extra_recipes: tuple = ()
    hide: object = None

    @functools.cached_property
    def recipes(self):
        """{path relative to ROOT (or absolute outside it): loaded config}."""
        paths = [p for p in glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True)
                 if os.sep + "_base_" + os.sep not in p] + [str(p) for p in self.extra_recipes]
        out = {}
        for path in sorted(paths):
            rel = os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path
            if not (self.hide and self.hide(rel)):
                out[rel] = _LOADED[rel] if rel in _LOADED else config.load(path)
                if not os.path.isabs(rel):
                    _LOADED[rel] = out[rel]
        return out

    def recipes_of(self, name):
        return [p for p, cfg in self.recipes.items() if cfg["model"]["name"] == name]

    @functools.cached_property
    def built(self):
        """{recipe: its model built under paddle.LazyGuard() (no weights filled in)}."""
        out = {}
        with paddle.LazyGuard():
            for p, cfg in self.recipes.items():
                out[p] = _BUILT[p] if p in _BUILT else builder.build_model(cfg["model"])
                if not os.path.isabs(p):
                    _BUILT[p] = out[p]
        return out

    @functools.cached_property
    def parts(self):
        """Registry names of the models that serve only as another's `weights().backbone`."""
        backbones = {MODELS.name_of(type(m.weights().backbone)) for m in self.built.values()
                     if m.weights().backbone is not None}
        return {n for n in backbones if n and not self.recipes_of(n)}

    def instance(self, name):
        recipe = next(iter(self.recipes_of(name)), None)
        if recipe:
            return self.built[recipe]
        with paddle.LazyGuard():
            return MODELS.get(name)()

    @functools.cached_property
    def conftest(self):
        """(its tree, {constant: string value}, {fixture name: its source})."""
        path = os.path.join(ROOT, "tests", "conftest.py")
        tree = _tree(path)
        source = open(path, encoding="utf-8").read()
        constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                     and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                     for t in n.targets if isinstance(t, ast.Name)}
        fixtures = {n.name: ast.get_source_segment(source, n) for n in tree.body if isinstance(n, ast.FunctionDef)
                    and any("fixture" in ast.unparse(d) for d in n.decorator_list)}
        return tree, constants, fixtures

    def recipes_named(self, node):
        """The recipe paths a piece of test source names: string literals and conftest's constants."""
        constants = self.conftest[1]
        out = set()
        for n in ast.walk(node):
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                out.add(n.value)
            elif isinstance(n, ast.Name) and n.id in constants:
                out.add(constants[n.id])
        return out

    @functools.cached_property
    def tests(self):
        """What tests/test_*.py (this file aside) hold, read as text (parsing them all costs seconds):
        `numbers`, every integer literal of at least six digits (an exact parameter count, e.g.) and the
        keys tables' num_params; `imports`, the modules imported (`from a import b` as a.b too);
        `fixtures`, what the tests take: their arguments, and the quoted names in a module that
        parametrizes a test over fixture names (`request.getfixturevalue`)."""
        numbers, imports, fixtures = set(), set(), set()
        for path in sorted(glob.glob(os.path.join(ROOT, "tests", "test_*.py"))):
            if os.path.basename(path) == os.path.basename(__file__):
                continue
            source = open(path, encoding="utf-8").read()
            numbers |= {int(n.replace("_", "")) for n in re.findall(r"(?<![\w.])\d{1,3}(?:_\d{3})+(?![\w.])|"
                                                                      r"(?<![\w.])\d{6,}(?![\w.])", source)}
            for m in IMPORT.finditer(source):
                if m.group(1):
                    names = [n.strip() for n in (m.group(2) or m.group(3)).split(",") if n.strip()]
                    imports |= {m.group(1)} | {f"{m.group(1)}.{n.split()[0]}" for n in names}
                else:
                    imports |= {n.split()[0] for n in m.group(4).split(",") if n.strip()}
            for m in re.finditer(r"^def test_\w+\(([^)]*)\)", source, re.M):
                fixtures |= {a.split("=")[0].split(":")[0].strip() for a in m.group(1).split(",")}
            if "getfixturevalue" in source:
                fixtures |= set(re.findall(r"[\"'](\w+)[\"']", source))
        for path in glob.glob(os.path.join(ROOT, "tests", "data", "keys_*.json")):
            with open(path, encoding="utf-8") as f:
                numbers.add(json.load(f).get("num_params"))
        return types.SimpleNamespace(numbers=numbers, imports=imports, fixtures=fixtures)

    def read(self, *path):
        with open(os.path.join(ROOT, *path), encoding="utf-8") as f:
            return f.read()

    @functools.cached_property
    def config_reference(self):
        """(the committed page, tools/config_reference.py, the component sections the code gives now)."""
        tool = _tool("config_reference")
        return self.read("docs", "config-reference.md"), tool, "\n".join(tool.component_sections())

    @functools.cached_property
    def model_zoo(self):
        tool = _tool("download")
        return self.read("docs", "model-zoo.md").splitlines(), tool.markdown_table("../").splitlines()

    @functools.cached_property
    def macs(self):
        """The recipes' records that tools/download.py's model-zoo table reads."""
        with open(_tool("download").FLOPS_JSON, encoding="utf-8") as f:
            return json.load(f)["recipes"]

    @functools.cached_property
    def model_pages(self):
        """{docs page: its text} of the site's Models section."""
        nav = yaml.safe_load(self.read("mkdocs.yml"))["nav"]
        models = next(list(e.values())[0] for e in nav if isinstance(e, dict) and "Models" in e)
        pages = [list(e.values())[0] for e in models]
        return {p: self.read("docs", p) for p in pages if p != "model-zoo.md"}


def entries_of(name):
    return [WEIGHTS.get(n) for n in WEIGHTS.names() if WEIGHTS.get(n).model == name]


# ---------------------------------------------------------------- the checks: (project, model) -> what is missing
def check_registered(p, name):
    cls = MODELS.get(name)
    if not (isinstance(cls, type) and issubclass(cls, ZooModel)):
        return f"{cls!r} is not an engine.model.ZooModel"
    if cls.__module__ not in set(component_modules()) | set(ENGINE_MODULES):
        return f"{cls.__module__} is listed in no package's COMPONENTS"


def _imports(path, module):
    """Dotted names a file imports (inside functions too; relative ones resolved, `from a import b` as a.b)."""
    out = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")[:len(module.split(".")) - node.level]
                base = ".".join(package + ([base] if base else []))
            out += [base] + [f"{base}.{a.name}" for a in node.names]
    return out


def check_imports(p, name):
    cls = MODELS.get(name)
    ours = {d for d in os.listdir(ROOT) if os.path.isfile(os.path.join(ROOT, d, "__init__.py"))} | {"tools"}
    others = {MODELS.get(n).__module__ for n in MODELS.names() if n not in p.parts} - {cls.__module__}
    bad = []
    for imported in _imports(inspect.getsourcefile(cls), cls.__module__):
        top = imported.split(".")[0]
        if top not in ours or top == "ops" or (top == "engine" and not re.match(r"engine\.training\b", imported)):
            continue
        if top == "models" and imported not in others:
            continue
        bad.append(imported)
    return f"imports {', '.join(sorted(set(bad)))}" if bad else None


def check_arguments(p, name):
    cls, tool = MODELS.get(name), p.config_reference[1]
    docs = tool.arg_docs(cls)
    bad = [a.name for a in tool.arguments(cls)
           if a.annotation is inspect.Parameter.empty or not docs.get(a.name)]
    return f"without a type or a meaning: {', '.join(bad)}" if bad else None


def check_config_reference(p, name):
    page, tool, sections = p.config_reference
    heading = f"### {tool.component_heading(name, MODELS)}"
    fresh = _section(sections, heading)
    if _section(page, heading) != fresh:
        return f"its section ({heading}) differs from the code's"


def check_weights(p, name):
    if entries_of(name):
        return None
    layouts = [m for m in p.instance(name).weights().layout_models if entries_of(m)]
    return None if layouts else "no entry names it and its weights() names no layout_models with entries"


def check_param_count(p, name):
    if any(e.num_params for e in entries_of(name)):
        return None   # tests/test_registry.py builds the entry's model and compares
    counts = {builder.count_params(p.built[r]) for r in p.recipes_of(name) if not r.endswith("_demo.yaml")}
    found = counts & p.tests.numbers
    return None if found else f"no entry's num_params nor any test holds its full-size counts {sorted(counts)}"


def check_model_zoo(p, name):
    page, table = p.model_zoo
    for e in entries_of(name):
        rows = [row for row in table if f"<code>{e.name}</code>" in row.replace("<wbr>", "")]
        if not rows or any(row not in page for row in rows):
            return f"the rows of {e.name} are not the generator's"


def check_model_test(p, name):
    module = MODELS.get(name).__module__
    return None if module in p.tests.imports else f"no tests/test_*.py imports {module}"


def _demos(p, name):
    return [r for r in p.recipes_of(name) if r.endswith("_demo.yaml")]


def check_demo_recipe(p, name):
    demos = _demos(p, name)
    if not demos:
        return "no *_demo.yaml recipe"
    bad = [d for d in demos if len(d.split(os.sep)) != 4 or not d.startswith("configs" + os.sep)]
    return f"not at configs/<area>/<family>/: {', '.join(bad)}" if bad else None


def check_full_recipe(p, name):
    full = [r for r in p.recipes_of(name) if not r.endswith("_demo.yaml")]
    if not full:
        return "no full-size recipe"
    small = [r for r in full if builder.count_params(p.built[r]) <= 1_000_000]
    return f"a million parameters or fewer: {', '.join(small)}" if small else None


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def check_demo_data(p, name):
    export = _tree(os.path.join(ROOT, "tests", "test_export.py"))
    by_folder = ast.literal_eval(_assigned(export, "DEMO_DATA"))
    default = next(ast.literal_eval(n.args[1]) for n in ast.walk(export) if isinstance(n, ast.Call)
                   and isinstance(n.func, ast.Attribute) and n.func.attr == "get"
                   and ast.unparse(n.func.value) == "DEMO_DATA")
    fixtures, make_demo = p.conftest[2], p.read("data", "make_demo.py")
    if not _demos(p, name):
        return "no demo recipe"
    for demo in _demos(p, name):
        names = by_folder.get(os.path.basename(os.path.dirname(demo)), default)
        written = ""
        for fixture in names:
            generators = re.findall(r"\b(demo_\w+)\.make\(", fixtures.get(fixture, ""))
            if not generators or any(g not in make_demo or not os.path.isfile(os.path.join(ROOT, "data", g + ".py"))
                                     for g in generators):
                return f"{demo}: fixture {fixture} writes no data of a data/make_demo.py generator"
            written += fixtures[fixture] + "".join(p.read("data", g + ".py") for g in generators)
        for path in _strings(p.recipes.get(demo, {}).get("reader", {})):
            folder = path.split("/")[1] if path.startswith("data/") else None
            if folder and f'"{folder}"' not in written:
                return f"{demo} reads {path}, which none of {', '.join(names)} writes"


def check_demo_trained(p, name):
    _, constants, fixtures = p.conftest
    if not _demos(p, name):
        return "no demo recipe"
    for demo in _demos(p, name):
        naming = [rf"\b{c}\b" for c, v in constants.items() if v == demo] + [re.escape(f'"{demo}"')]
        training = [f for f, src in fixtures.items() if re.search(r"tool\(\"train\"|_trained\(", src)
                    and any(re.search(n, src) for n in naming)]
        if not training:
            return f"{demo}: no session fixture of tests/conftest.py trains it"
        if not set(training) & p.tests.fixtures:
            return f"{demo}: no test takes {', '.join(training)}"


def check_export(p, name):
    cls = MODELS.get(name)
    return None if cls.export_spec is not ZooModel.export_spec else "no export_spec"


def check_macs(p, name):
    missing = [r for r in p.recipes_of(name) if r not in p.macs]
    return f"no record of {', '.join(missing)}" if missing else None


def _missing_demos(p, name, named, what):
    missing = [d for d in _demos(p, name) if d not in named]
    return f"{', '.join(missing)} not in {what}" if missing or not _demos(p, name) else None


def check_api_models(p, name):
    demos = ast.literal_eval(_assigned(_tree(os.path.join(ROOT, "tests", "test_api_models.py")), "DEMOS"))
    named = {d for d in _demos(p, name) if demos.get(os.path.basename(d)[:-5]) == MODELS.get(name).__name__}
    return _missing_demos(p, name, named, "tests/test_api_models.py DEMOS")


def check_host_round_trips(p, name):
    node = _assigned(_tree(os.path.join(ROOT, "tests", "test_host_round_trips.py")), "DEMOS")
    return _missing_demos(p, name, p.recipes_named(node), "tests/test_host_round_trips.py DEMOS")


def check_inferencer(p, name):
    node = _function(_tree(os.path.join(ROOT, "tests", "test_inferencer.py")), "cases")
    return _missing_demos(p, name, p.recipes_named(node), "tests/test_inferencer.py cases")


def check_quantize(p, name):
    node = _assigned(_tree(os.path.join(ROOT, "tests", "test_quantize.py")), "DEMOS")
    return _missing_demos(p, name, p.recipes_named(node) | set(NOT_QUANTIZED), "tests/test_quantize.py DEMOS")


def check_gpu_check(p, name):
    inputs = _assigned(_tree(os.path.join(ROOT, "tools", "gpu_check.py")), "DEMO_INPUTS")
    keys = {k.value for k in inputs.keys}
    named = {d for d in _demos(p, name) if os.path.basename(d)[:-5] in keys}
    return _missing_demos(p, name, named, "tools/gpu_check.py DEMO_INPUTS")


def check_docs_page(p, name):
    readme = p.read("README.md")
    if not _demos(p, name):
        return "no demo recipe"
    for demo in _demos(p, name):
        pages = [page for page, text in p.model_pages.items() if os.path.basename(demo) in text]
        if not pages:
            return f"no page of the Models section names {os.path.basename(demo)}"
        if not any(f"](docs/{page})" in readme for page in pages):
            return f"README.md links none of {', '.join(pages)}"


# key -> (the list it belongs to, its check)
CHECKS = {
    "registered": ("every", check_registered),
    "imports": ("every", check_imports),
    "arguments": ("every", check_arguments),
    "config-reference": ("every", check_config_reference),
    "weights": ("every", check_weights),
    "param-count": ("every", check_param_count),
    "model-zoo": ("every", check_model_zoo),
    "model-test": ("every", check_model_test),
    "demo-recipe": ("recipes", check_demo_recipe),
    "full-recipe": ("recipes", check_full_recipe),
    "demo-data": ("recipes", check_demo_data),
    "demo-trained": ("recipes", check_demo_trained),
    "export": ("recipes", check_export),
    "macs": ("recipes", check_macs),
    "api-models": ("recipes", check_api_models),
    "host-round-trips": ("recipes", check_host_round_trips),
    "inferencer": ("recipes", check_inferencer),
    "quantize": ("recipes", check_quantize),
    "gpu-check": ("recipes", check_gpu_check),
    "docs-page": ("recipes", check_docs_page),
}


def agreement(items, checks=CHECKS):
    """What keeps the page and CHECKS equal: items without a check, checks without an item, and items
    in the other list than their check's."""
    problems = [f"checklist item {k} ({items[k][1]!r}) has no check in tests/test_checklist.py"
                for k in items if k not in checks]
    problems += [f"check {k} has no item in {DOC}'s checklist" for k in checks if k not in items]
    problems += [f"checklist item {k} is under the {items[k][0]} list, its check under the {checks[k][0]} list"
                 for k in items if k in checks and items[k][0] != checks[k][0]]
    return problems


def failures(project, items, names=None):
    """[(model, key, message)] of every model of `names` (default: every registered one) that misses
    an item: the message is the item's text, the model's name and what was found missing."""
    project.recipes   # a recipe's custom_imports register their models first
    out = []
    for name in names or MODELS.names():
        for key, (scope, text) in items.items():
            if scope == "recipes" and name in project.parts:
                continue
            missing = CHECKS[key][1](project, name)
            if missing:
                out.append((name, key, f"{text} [model {name}: {missing}]"))
    return out


@pytest.fixture(scope="module")
def items():
    load_all()
    with open(DOC, encoding="utf-8") as f:
        return checklist(f.read())


@pytest.fixture(scope="module")
def project():
    return Project()


# ---------------------------------------------------------------- the tests
def test_the_checklist_and_the_checks_are_one(items):
    assert len(items) >= 10
    assert not agreement(items), "\n".join(agreement(items))


def test_every_registered_model_has_every_piece_of_the_checklist(items, project):
    assert len(MODELS.names()) >= 10 and project.parts == {"ResNet"}   # the shared backbone, by its users
    found = failures(project, items)
    assert not found, "\n".join(message for _, _, message in found)


def test_the_page_and_the_checks_disagreeing_fails():
    text = textwrap.dedent(f"""\
        {SECTION}
        ### Every registered model
        - **`registered`**: one
        - **`no-such-check`**: two,
          over two lines
        ### A model with recipes
        - **`imports`**: three

        ## Next
        - **`export`**: not in the section
        """)
    items = checklist(text)
    assert items == {"registered": ("every", "one"), "no-such-check": ("every", "two, over two lines"),
                     "imports": ("recipes", "three")}
    checks = {k: CHECKS[k] for k in ("registered", "imports", "export")}
    assert agreement(items, checks) == [
        "checklist item no-such-check ('two, over two lines') has no check in tests/test_checklist.py",
        f"check export has no item in {DOC}'s checklist",
        "checklist item imports is under the recipes list, its check under the every list"]


def _added(broken, intact):
    """The failures a broken project has that the intact one has not (none else may go away)."""
    assert set(intact) <= set(broken), set(intact) - set(broken)
    return [f for f in broken if f not in intact]


def test_a_model_without_a_full_recipe_fails_with_that_item(items, project):
    """TSN with its full-size recipes taken away misses exactly one more piece."""
    hidden = Project(hide=lambda rel: rel.startswith(os.path.join("configs", "video", "tsn", "tsn_r50")))
    assert not [r for r in hidden.recipes_of("TSN") if not r.endswith("_demo.yaml")]
    assert _added(failures(hidden, items, ["TSN"]), failures(project, items, ["TSN"])) == [
        ("TSN", "full-recipe", items["full-recipe"][1] + " [model TSN: no full-size recipe]")]


def test_a_model_without_export_spec_fails_with_that_item(items, project, monkeypatch):
    from models.video.stnet import StNet
    intact = failures(project, items, ["StNet"])
    monkeypatch.setattr(StNet, "export_spec", ZooModel.export_spec)   # what ZooModel gives: not exportable
    assert _added(failures(project, items, ["StNet"]), intact) == [
        ("StNet", "export", items["export"][1] + " [model StNet: no export_spec]")]


FAMILY = '''
"""A model family of one's own, kept outside the tree."""
import paddle.nn as nn
from paddle.static import InputSpec

from engine.model import ZooModel
from engine.registry import MODELS


@MODELS.register("ChecklistMLP")
class ChecklistMLP(ZooModel):
    """Mean-pooled frame features through one layer.

    Args:
        num_classes: classes of the multi-label head.
        feature_dim: size of a frame's feature vector.
    """

    def __init__(self, num_classes: int = 8, feature_dim: int = 1024):
        super().__init__()
        self.fc = nn.Linear(feature_dim, num_classes)

    def forward(self, batch):
        return {"probs": nn.functional.sigmoid(self.fc(batch["rgb"].mean(axis=1)))}

    def export_spec(self, example=None):
        return {"inputs": {"rgb": InputSpec([None, None, 1024], "float32")}, "outputs": ["probs"]}
'''


def test_a_family_of_ones_own_fails_with_each_item_it_lacks(items, tmp_path, monkeypatch):
    """A model file and a demo recipe outside the tree, brought in through the recipe's custom_imports:
    ZooModel, arguments with types and meanings, export_spec and a demo recipe are there; what the tree
    holds for a model (COMPONENTS, pages, entries, tests, the lists) is not, and its recipe is not
    under configs/."""
    monkeypatch.setattr(MODELS, "_items", dict(MODELS._items))
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "checklist_family.py").write_text(FAMILY)
    recipe = tmp_path / "checklist_mlp_demo.yaml"
    recipe.write_text(f"_base_: [{os.path.join(ROOT, 'configs', 'video', 'attention_lstm', 'attention_lstm_demo.yaml')}]\n"
                      "custom_imports: {imports: [checklist_family]}\n"
                      "model: {_delete_: true, name: ChecklistMLP, num_classes: 8}\n")
    try:
        project = Project(extra_recipes=(recipe,))
        found = failures(project, items, ["ChecklistMLP"])
    finally:
        sys.modules.pop("checklist_family", None)
    lacking = ["registered", "config-reference", "weights", "param-count", "model-test", "demo-recipe",
               "full-recipe", "demo-trained", "macs", "api-models", "host-round-trips", "inferencer", "quantize",
               "gpu-check", "docs-page"]
    assert [k for _, k, _ in found] == [k for k in items if k in lacking]
    for _, key, message in found:
        assert message.startswith(items[key][1] + " [model ChecklistMLP: "), message
