"""docs/config-reference.md is what tools/config_reference.py writes from the code; it lists every key
the validator accepts (the key set taken from the validator as it runs), and what it lists the
validator takes, while a key it does not list is refused."""
import importlib.util
import inspect
import os
import re
import sys

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
            assert rows[key][:2] == [f"`{spec[0].__name__}`", f"`{config_reference.yaml_value(spec[1])}`"]
            assert rows[key][3], f"{prefix}.{key} has no meaning on the page"
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
    """A value for a key from its page row (type, default, allowed, ...): the default, else one the
    `allowed` column admits, else one of the type."""
    kind, default, allowed = (c.strip("`") for c in cells[:3])
    if default not in ("null", "required"):
        return default
    m = re.match(r"`(>=?) (\d+)`|`([^`]+)`", cells[2])
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
