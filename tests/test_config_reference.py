"""docs/config-reference.md is what tools/config_reference.py writes from the code; it lists every key
the validator accepts (the key set taken from the validator as it runs), and what it lists the
validator takes, while a key it does not list is refused."""
import ast
import importlib.util
import inspect
import os
import re
import sys
import textwrap

import pytest
import yaml

from engine import components, config, registry
from engine.errors import ConfigError
from tests.conftest import TSN_DEMO
from tests.helpers import ROOT, tool

sys.path.insert(0, os.path.join(ROOT, "tools"))
import config_reference  # noqa: E402

PAGE = os.path.join(ROOT, "docs", "config-reference.md")


@pytest.fixture(scope="module")
def page():
    components.load_all()
    with open(PAGE, encoding="utf-8") as f:
        return f.read()


def tables(text):
    """{anchor of a ## or ### heading: {first cell's `key`: [the other cells]}} of the page's tables."""
    out, current = {}, None
    for line in text.splitlines():
        m = re.match(r"#{2,3} (.+)", line)
        if m:
            current = out.setdefault(config_reference.slug(m.group(1)), {})
            continue
        m = re.match(r"\| `([^`]+)` \| (.*) \|$", line)
        if m and current is not None:
            current[m.group(1)] = [c.strip() for c in m.group(2).split(" | ")]
    return out


def test_the_committed_page_is_the_generators_output(page):
    assert page == config_reference.render(), "docs/config-reference.md is stale: run python tools/config_reference.py"


def validator_schemas(monkeypatch):
    """What the validator checks a full recipe against, recorded as it runs: {prefix: key table} of
    the engine sections, {prefix: (registry, extra key table)} of the component sections."""
    sections, comps = {}, {}
    real_section, real_component = config._Checker.section, config._Checker.component

    def section(self, node, schema, prefix):
        sections[prefix] = schema
        return real_section(self, node, schema, prefix)

    def component(self, node, reg, prefix, extra_keys=None):
        comps[prefix] = (reg, extra_keys)
        return real_component(self, node, reg, prefix, extra_keys)

    monkeypatch.setattr(config._Checker, "section", section)
    monkeypatch.setattr(config._Checker, "component", component)
    config.load(TSN_DEMO, ["train.amp.enable=false", "eval.amp.enable=false", "runtime.seed=0",
                           "reader.train.sampler={name: Epoch}", "reader.train.collate={name: Stack}"])
    return sections, comps


def test_every_key_the_validator_accepts_is_on_the_page(page, monkeypatch):
    found = tables(page)
    sections, comps = validator_schemas(monkeypatch)
    assert set(sections) == {"train", "train.amp", "train.ema", "train.early_stop", "train.wandb", "eval", "eval.amp",
                             "runtime"}
    anchor = {"train": "train", "train.amp": "amp", "eval.amp": "amp", "eval": "eval", "runtime": "runtime",
              "train.ema": "ema", "train.early_stop": "early_stop", "train.wandb": "wandb"}
    for prefix, schema in sections.items():
        rows = found[anchor[prefix]]
        assert set(rows) == set(schema), prefix
        for key, spec in schema.items():
            assert rows[key][0].split(":")[0] == f"`{spec[0].__name__}`", (prefix, key)
            assert rows[key][1] == f"`{config_reference.yaml_value(spec[1])}`", (prefix, key)
            assert rows[key][2], f"{prefix}.{key} has no meaning on the page"
    loader = [(prefix, extra) for prefix, (reg, extra) in comps.items() if extra]
    assert {p for p, _ in loader} == {"reader.train", "reader.val", "reader.test"}
    for _, extra in loader:
        assert set(found["reader"]) == set(extra)
    assert set(found["top-level-keys"]) == set(config.TOP_KEYS) | set(config.SPLITS)
    assert set(found["custom_imports"]) == set(components.CUSTOM_IMPORTS_KEYS)
    # the registries the validator consults (top-level components, nested ones, reader splits), and
    # every registry of engine/registry.py: each name with exactly its constructor's keyword arguments
    used = {reg for reg, _ in comps.values()}
    assert used >= {registry.MODELS, registry.DATASETS, registry.TRANSFORMS, registry.COLLATES, registry.SAMPLERS,
                    registry.METRICS, registry.OPTIMIZERS, registry.LR_SCHEDULES, registry.OUTPUTS}
    every = [r for r in vars(registry).values() if isinstance(r, registry.Registry)]
    assert set(every) == used
    for reg in every:
        assert reg.names(), reg.kind
        for name in reg.names():
            params = [p for p in inspect.signature(reg.get(name)).parameters.values()
                      if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
            rows = found[config_reference.slug(f"{name} ({reg.kind})")]
            assert list(rows) == [p.name for p in params], (reg.kind, name)


def sample(cells):
    """A value for a key from its page row (type / allowed, default, meaning): the default, else one
    the allowed part admits, else one of the type."""
    kind, _, allowed = cells[0].partition(": ")
    kind, default = kind.strip("`"), cells[1].strip("`")
    if default not in ("null", "required"):
        return default
    m = re.match(r"`(>=?) (\d+)`|`([^`]+)`", allowed)
    if m and m.group(2):
        return str(int(m.group(2)) + (m.group(1) == ">"))
    if m:
        return m.group(3)
    return {"int": "1", "float": "1.0", "str": "x", "bool": "false", "list": "[]", "dict": "{}"}[kind]


def test_keys_listed_on_the_page_are_accepted_and_an_unlisted_one_is_refused(page):
    """Independently of how the page was made: each key of the engine sections and of a few components,
    as the page lists it (with its default, or a value of its type), loads; an unlisted key fails with
    one message naming it."""
    found = tables(page)
    where = {"train": "train", "amp": "train.amp", "eval": "eval", "runtime": "runtime", "reader": "reader.val",
             "tsn-model": "model", "momentum-optimizer": "optimizer", "piecewise-lr-schedule": "lr",
             "classification-metric": "metric", "scale-transform": "reader.train.transforms.0"}
    components_of = {"sampler": "{name: Epoch}", "collate": "{name: Stack}", "backbone": "{name: ResNet, depth: 18}"}
    overrides = ["optimizer={name: Momentum}", "lr={name: Piecewise, boundaries: [8], values: [0.01, 0.001]}"]
    checked = 0
    for anchor, prefix in where.items():
        assert found[anchor], anchor
        for key, cells in found[anchor].items():
            value = components_of.get(key) or sample(cells)
            cfg = config.load(TSN_DEMO, overrides + [f"{prefix}.{key}={value}"])
            assert cfg is not None
            checked += 1
        with pytest.raises(ConfigError, match=rf"{re.escape(prefix)}\.no_such_key: unknown key"):
            config.load(TSN_DEMO, overrides + [f"{prefix}.no_such_key=1"])
    assert checked > 40
    with pytest.raises(ConfigError, match=r"^[^\n]*: no_such_section: unknown top-level key[^\n]*$"):
        config.load(TSN_DEMO, ["no_such_section=1"])


def test_check_fails_on_a_stale_page(tmp_path):
    stale = tmp_path / "config-reference.md"
    stale.write_text(open(PAGE, encoding="utf-8").read().replace("| `epochs` |", "| `epoch` |"))
    proc = tool("config_reference", "--check", "--page", stale, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "is stale" in proc.stderr and "python tools/config_reference.py" \
        in proc.stderr
    assert "| `epoch` |" in stale.read_text()   # --check never writes


def test_a_key_table_entry_without_a_meaning_stops_the_generator(tmp_path):
    """The meanings come from the key tables' comments; one missing is an error naming the line."""
    path = tmp_path / "tables.py"
    path.write_text('KEYS = {\n    "a": (int, 1),   # the a\n    "b": (int, 2),\n}\n')
    spec = importlib.util.spec_from_file_location("tables", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(SystemExit, match=r"tables.py:3: KEYS\['b'\] has no comment"):
        config_reference.table_entries(module, "KEYS")


# ---------------------------------------------------------------- component arguments: meaning, allowed values
def _component_arguments():
    """[(registry, name, class, [parameters a recipe can set])] of every registered component."""
    components.load_all()
    return [(reg, name, reg.get(name), [p for p in inspect.signature(reg.get(name)).parameters.values()
                                        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)])
            for reg in config_reference.KINDS for name in reg.names()]


def test_every_component_argument_has_a_meaning(page):
    """In the code (the Args: of the class's docstrings, which the generator reads) and on the page:
    each argument's row has a meaning, and a missing one is named with its component."""
    found = tables(page)
    in_code, on_page = [], []
    for reg, name, cls, params in _component_arguments():
        docs = config_reference.arg_docs(cls)
        rows = found[config_reference.slug(f"{name} ({reg.kind})")]
        for p in params:
            if not docs.get(p.name, "").strip():
                in_code.append(f"{reg.kind} {name}: {p.name}")
            if not rows[p.name][2].strip():
                on_page.append(f"{reg.kind} {name}: {p.name}")
    assert not in_code, "no `name: meaning.` in the Args: of their docstrings: " + ", ".join(in_code)
    assert not on_page, "no meaning on docs/config-reference.md: " + ", ".join(on_page)


def test_an_argument_without_a_meaning_stops_the_generator(monkeypatch):
    """An undocumented argument is named by the generator; one a base class documents (the readers'
    transforms / seed / skip_bad in SampleDataset) counts as documented."""
    reg = registry.Registry("model")

    class Base:
        """Args:
            seed: documented once, here.
        """

        def __init__(self, seed=0):
            pass

    @reg.register("Fake")
    class Fake(Base):
        """A model.

        Args:
            depth: the layers.
        """

        def __init__(self, depth: int = 1, width: int = 2, seed: int = 0):
            super().__init__(seed)

    monkeypatch.setattr(config_reference, "KINDS", (reg,))
    assert config_reference.undocumented() == [("model", "Fake", "width")]
    with pytest.raises(SystemExit, match=r"without a meaning .*: model Fake: width$"):
        config_reference.render()


def _allowed(cell):
    """The values a `type / allowed` cell lists after its type, as text (None: no closed set)."""
    kind, sep, allowed = cell.partition(": ")
    return re.findall(r"`([^`]*)`", allowed.removeprefix("items from ")) if sep else None


def test_closed_sets_are_shown_with_their_values(page):
    """A Literal annotation's values are on the page, and these closed sets are what their sources
    say (the source named in each line, not the annotation)."""
    import sacrebleu.metrics.bleu
    expected = {
        ("lr schedule", "Piecewise", "by"): ["epoch", "step"],               # optim.py module docstring
        ("lr schedule", "StepDecay", "by"): ["epoch", "step"],
        ("reader", "Kinetics", "format"): ["video", "frames"],                # videos or frame folders
        ("reader", "Kinetics", "backend"): ["decord", "cv2", "pyav"],         # the three decoders it opens
        ("reader", "GLUE", "split"): ["train", "dev", "test"],                # GLUE's TSV files
        ("reader", "Cityscapes", "mode"): ["train", "val", "test"],           # leftImg8bit/<mode>/ folders
        ("model", "ResNet", "depth"): ["18", "34", "50", "101", "152"],       # He et al., Table 1
        ("model", "TSN", "view_average"): ["prob", "feature"],
        ("metric", "COCO", "iou_types"): ["bbox", "segm"],                    # pycocotools' iouType (no keypoints)
        ("metric", "BLEU", "tokenize"): list(sacrebleu.metrics.bleu.BLEU.TOKENIZERS),
    }
    found = tables(page)
    literal = {}
    for reg, name, cls, params in _component_arguments():
        rows = found[config_reference.slug(f"{name} ({reg.kind})")]
        for p in params:
            values, _ = config.choices(p.annotation)
            shown = _allowed(rows[p.name][0])
            if values is not None:
                literal[(reg.kind, name, p.name)] = shown
                assert shown == [config_reference.yaml_value(v) for v in values], (reg.kind, name, p.name)
            else:
                assert shown is None, (reg.kind, name, p.name)
    for key, values in expected.items():
        assert literal.get(key) == values, key
    assert len(literal) >= 25


def test_a_component_check_against_a_fixed_set_has_a_literal_annotation():
    """An argument a component checks with `x not in <a fixed set>` is annotated with the Literal of
    that set, so the page shows it and the validator checks it; a new check without one fails here."""
    def fixed(node, cls):
        """Whether `node` is a set fixed in the source: a tuple of constants, a module-level or class-level
        tuple, dict or set (`MODES`, `self.MODES`)."""
        if isinstance(node, ast.Tuple):
            return all(isinstance(e, ast.Constant) for e in node.elts)
        if isinstance(node, ast.Name):
            value = vars(sys.modules[cls.__module__]).get(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            value = getattr(cls, node.attr, None)
        else:
            return False
        return isinstance(value, (tuple, dict, set, frozenset))

    bare = []
    for reg, name, cls, params in _component_arguments():
        names = {p.name: p for p in params}
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id in names
                    and isinstance(node.ops[0], ast.NotIn) and fixed(node.comparators[0], cls)
                    and config.choices(names[node.left.id].annotation)[0] is None):
                bare.append(f"{reg.kind} {name}: {node.left.id}")
    assert not bare, "closed sets without a typing.Literal annotation: " + ", ".join(sorted(set(bare)))


@pytest.mark.parametrize("override, message", [
    ("model.view_average=mean", r"model\.view_average: must be one of prob, feature, got 'mean'"),
    ("model.backbone.depth=51", r"model\.backbone\.depth: must be one of 18, 34, 50, 101, 152, got 51"),
    ("lr.by=Epoch", r"lr\.by: must be one of epoch, step, got 'Epoch' \(did you mean 'epoch'\?\)"),
    ("model.backbone.depth='50'", r"model\.backbone\.depth: must be one of 18, 34, 50, 101, 152, got '50'"),
    ("metric={name: COCO, iou_types: [bbox, keypoints]}", r"metric\.iou_types: must be one of bbox, segm, got "
                                                         r"'keypoints'"),
])
def test_a_value_outside_a_literal_is_one_line_naming_key_and_values(override, message):
    with pytest.raises(ConfigError) as e:
        config.load(TSN_DEMO, [override])
    assert re.fullmatch(rf"-o: {message}", str(e.value)), str(e.value)   # -o: where the value came from


def test_a_union_annotation_takes_its_members_only():
    """PadSequences' keys (list | dict, once `object`): a mapping loads, a number is one line naming both."""
    cfg = config.load(TSN_DEMO, ["reader.train.collate={name: PadSequences, keys: {imgs: 0}}"])
    assert cfg["reader"]["train"]["collate"]["keys"] == {"imgs": 0}
    with pytest.raises(ConfigError, match=r"^-o: reader\.train\.collate\.keys: expected list or dict, got int 3$"):
        config.load(TSN_DEMO, ["reader.train.collate={name: PadSequences, keys: 3}"])
    with pytest.raises(ConfigError, match=r"^-o: metric\.iou_types: expected list, got str 'bbox'$"):
        config.load(TSN_DEMO, ["metric={name: COCO, iou_types: bbox}"])


def test_the_configs_page_quotes_the_literal_message():
    with pytest.raises(ConfigError) as e:
        config.load(TSN_DEMO, ["lr.by=epochs"])
    assert f"`error: {e.value}`" in _configs_page()


def test_a_value_inside_a_literal_loads():
    cfg = config.load(TSN_DEMO, ["model.view_average=feature", "model.backbone.depth=18", "lr.by=step",
                                 "metric={name: COCO, iou_types: [segm]}"])
    assert (cfg["model"]["view_average"], cfg["lr"]["by"], cfg["metric"]["iou_types"]) == ("feature", "step", ["segm"])


# ---------------------------------------------------------------- docs/configs.md says what the code does
CONFIGS_PAGE = os.path.join(ROOT, "docs", "configs.md")


def _configs_page():
    with open(CONFIGS_PAGE, encoding="utf-8") as f:
        return f.read()


def _within(quote, real, where=""):
    """Every key of `quote` is in `real` with the same value (mappings compared key by key)."""
    if isinstance(quote, dict):
        assert isinstance(real, dict), where
        for key, value in quote.items():
            assert key in real, f"{where}{key}"
            _within(value, real[key], f"{where}{key}.")
    else:
        assert quote == real, where


def test_the_annotated_recipe_quotes_the_real_file():
    quote = yaml.safe_load(re.search(r"```yaml\n(.*?)```", _configs_page(), re.S).group(1))
    with open(os.path.join(ROOT, "configs", "video", "tsn", "tsn_r50_100e_k400.yaml"), encoding="utf-8") as f:
        real = yaml.safe_load(f)
    assert set(quote) == set(real) and set(quote["reader"]) == {"train"}
    _within(quote, real)


def test_the_messages_quoted_on_the_configs_page_are_the_validators(tmp_path, capsys):
    """The error and note lines docs/configs.md shows, produced again (in-process, as tools/train.py
    prints them: `error: ` and the ConfigError)."""
    components.load_all()
    page = _configs_page()
    for override in ("train.epoch=1", "reader.train.batch_size=eight", "model.backbone.depht=18",
                     "runtime.device=tpu"):
        with pytest.raises(ConfigError) as e:
            config.load(TSN_DEMO, [override])
        assert f"error: {e.value}\n" in page, override
    config.load(TSN_DEMO, ["train.max_steps=4", "reader.train.batch_size=8", "runtime.num_threads=2"])
    note = capsys.readouterr().out
    assert note.startswith("note: -o train.max_steps=4 replaces") and note in page
    # the recipe of one's own, written as the page's heredoc writes it, with its typo
    recipe = re.search(r"cat > /tmp/tsn_small.yaml <<EOF\n(.*?)\nEOF\n", page, re.S).group(1)
    path = tmp_path / "tsn_small.yaml"
    path.write_text(recipe.replace("$PWD", ROOT))
    with pytest.raises(ConfigError) as e:
        config.load(str(path))
    assert f"error: {e.value}\n".replace(str(path), "/tmp/tsn_small.yaml") in page
    path.write_text(recipe.replace("$PWD", ROOT).replace("save_intervall", "save_interval"))
    assert config.load(str(path))["model"]["backbone"] == {"name": "ResNet", "depth": 18, "base_channels": 32}
    # without _delete_, the base's momentum stays and Adam refuses it, naming the base file
    base = os.path.join(ROOT, "configs", "vision", "deeplabv3", "deeplabv3_r50vd_os8_40k_voc12aug.yaml")
    path.write_text(f"_base_: {base}\noptimizer: {{name: Adam, weight_decay: 0.0}}\n")
    with pytest.raises(ConfigError) as e:
        config.load(str(path))
    assert f"error: {e.value}\n".replace(ROOT + os.sep, "") in page
