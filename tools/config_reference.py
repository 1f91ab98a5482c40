"""Write docs/config-reference.md from the code: the key tables of engine/config.py (their comments
are the meanings), custom_imports' keys (engine/components.py) and every registered component's
constructor arguments: their meanings from the `Args:` lists of the class docstrings (a base class's
for an argument passed on to it; an argument without one stops the generator, naming it), their
allowed values from `typing.Literal` annotations (what engine/config.py's validator checks).

python tools/config_reference.py            # write the page
python tools/config_reference.py --check    # exit 1 if the committed page differs from the code
"""
import _bootstrap  # noqa: F401  (environment before paddle)

import argparse
import ast
import inspect
import io
import os
import re
import sys
import tokenize
import types
import typing

import yaml

from engine import cli, components, config, registry

PAGE = "docs/config-reference.md"   # relative to the repository

# the engine's sections: (heading = anchor, dotted names it covers, module, key table)
ENGINE_SECTIONS = (
    ("train", "train", config, "TRAIN_KEYS"),
    ("amp", "train.amp, eval.amp", config, "AMP_KEYS"),
    ("ema", "train.ema", config, "EMA_KEYS"),
    ("early_stop", "train.early_stop", config, "EARLY_STOP_KEYS"),
    ("wandb", "train.wandb", config, "WANDB_KEYS"),
    ("eval", "eval", config, "EVAL_KEYS"),
    ("runtime", "runtime", config, "RUNTIME_KEYS"),
    ("reader", "reader.train, reader.val, reader.test", config, "LOADER_KEYS"),
    ("custom_imports", "custom_imports", components, "CUSTOM_IMPORTS_KEYS"),
)
# the component sections of a recipe and the registry that validates each (engine/config.py: validate)
COMPONENT_KEYS = {"model": registry.MODELS, "optimizer": registry.OPTIMIZERS, "lr": registry.LR_SCHEDULES,
                  "metric": registry.METRICS, "infer": registry.OUTPUTS, "reader": registry.DATASETS}
# the order of the component kinds on the page (a recipe's reading order)
KINDS = (registry.MODELS, registry.DATASETS, registry.TRANSFORMS, registry.COLLATES, registry.SAMPLERS,
         registry.METRICS, registry.OPTIMIZERS, registry.LR_SCHEDULES, registry.OUTPUTS)


def slug(heading):
    """The anchor the docs site gives a heading (Python-Markdown's default slugify)."""
    text = re.sub(r"[^\w\s-]", "", heading).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def kind_heading(reg):
    return f"{reg.kind}s"


def component_heading(name, reg):
    return f"{name} ({reg.kind})"


# ---------------------------------------------------------------- reading the key tables' source
def _comments(source):
    """{line number: comment text} of a Python source."""
    return {t.start[0]: t.string.lstrip("#").strip() for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type == tokenize.COMMENT}


def table_entries(module, name):
    """[(key, meaning, rule node or None)] of the table `name` (a dict literal key -> (type, default[, rule])
    or a tuple of strings) in `module`'s source, in source order: the meaning is the comment on the
    entry's lines, else the comment lines right above it. An entry without one is an error."""
    path = inspect.getsourcefile(module)
    source = open(path, encoding="utf-8").read()
    comments = _comments(source)
    node = next(n.value for n in ast.parse(source).body if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == name for t in n.targets))
    if isinstance(node, ast.Dict):
        items = [(k, v) for k, v in zip(node.keys, node.values)]
    else:
        items = [(e, e) for e in node.elts]
    out, taken = [], set()
    for key, value in items:
        first, last = key.lineno, value.end_lineno
        lines = set(range(first, last + 1))
        if lines & taken:
            raise SystemExit(f"{path}:{first}: {name}: one entry per line, so that each has its own comment")
        taken |= lines
        text = " ".join(comments[n] for n in sorted(lines) if n in comments)
        above, n = [], first - 1
        while not text and n in comments and n > node.lineno and n not in taken:
            above.insert(0, comments[n])
            n -= 1
        text = text or " ".join(above)
        if not text:
            raise SystemExit(f"{path}:{first}: {name}[{key.value!r}] has no comment saying what it means")
        rule = value.elts[2] if isinstance(value, ast.Tuple) and len(value.elts) > 2 else None
        out.append((key.value, text, rule))
    return out


def rule_text(rule, module):
    """What a table's range rule allows, read from its source: at_least(n), one_of(...), a named check
    of the items against a module-level tuple (`x not in LOGGERS`), or the message of a lambda or a
    named check."""
    if rule is None:
        return ""
    if isinstance(rule, ast.Call) and getattr(rule.func, "id", None) == "at_least":
        return code(f">= {ast.literal_eval(rule.args[0])}")
    if isinstance(rule, ast.Call) and getattr(rule.func, "id", None) == "one_of":
        return ", ".join(code(ast.literal_eval(a)) for a in rule.args)
    if isinstance(rule, ast.Name):
        source = inspect.getsource(getattr(module, rule.id))
        rule = ast.parse(source).body[0]
        for n in ast.walk(rule):
            if (isinstance(n, ast.Compare) and isinstance(n.ops[0], (ast.In, ast.NotIn))
                    and isinstance(n.comparators[0], ast.Name)
                    and isinstance(getattr(module, n.comparators[0].id, None), tuple)):
                return "items from " + ", ".join(code(v) for v in getattr(module, n.comparators[0].id))
    messages = [n.value for n in ast.walk(rule) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    if not messages:
        raise SystemExit(f"cannot tell what the rule {ast.unparse(rule)} allows")
    text = messages[0].removeprefix("must be ")
    return code(text) if re.match(r"[<>=]", text) else prose(text)


# ---------------------------------------------------------------- rendering
def yaml_value(value):
    """A default as a recipe would write it (YAML flow style)."""
    if isinstance(value, tuple):
        value = list(value)
    try:
        text = yaml.safe_dump(value, default_flow_style=True, width=10_000)
    except yaml.representer.RepresenterError:
        return repr(value)
    return text.strip().removesuffix("...").strip()


def code(text):
    return f"`{text}`" if text != "" else ""


def prose(text):
    """Docstring or comment text for a table cell or a line: Markdown specials outside `code` escaped."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):   # outside code spans
        parts[i] = (parts[i].replace("\\", "\\\\").replace("*", "\\*").replace("<", "&lt;").replace(">", "&gt;"))
    return "`".join(parts).replace("|", "\\|")


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cells) + " |" for cells in rows]
    return out


def first_sentence(paragraph):
    m = re.search(r"(?<!e\.g)(?<!i\.e)(?<!\.\.)(?<! al)(?<! vs)\.(\s|$)", paragraph)
    text = paragraph[:m.start() + 1] if m else paragraph
    return text[:-1] + "." if text.endswith(":") else text


def _paragraphs(doc):
    doc = inspect.cleandoc(doc or "")
    return [" ".join(line.strip() for line in p.splitlines()) for p in re.split(r"\n\s*\n", doc) if p.strip()]


def summary(obj):
    """The first sentence of the object's own docstring (not one inherited); its module's when the
    docstring opens with its `Args:` list (a module holding one model says what it is)."""
    own = obj.__dict__.get("__doc__") if isinstance(obj, type) else obj.__doc__
    paragraphs = _paragraphs(own)
    if paragraphs and paragraphs[0].startswith("Args:"):
        paragraphs = _paragraphs(sys.modules[obj.__module__].__doc__)
    return first_sentence(paragraphs[0]) if paragraphs else ""


def _docstrings(obj):
    """The docstrings an argument's meaning is looked up in: a class's own and its own __init__'s, then
    those of its bases in method-resolution order (an argument a subclass passes on to its base, as the
    readers' `transforms`, `seed` and `skip_bad`, is documented once, in the base); a function's own."""
    if not isinstance(obj, type):
        return [obj.__doc__]
    out = []
    for cls in obj.__mro__[:-1]:   # not `object`
        init = cls.__dict__.get("__init__")
        out += [cls.__dict__.get("__doc__"), getattr(init, "__doc__", None)]
    return out


def arg_docs(obj):
    """{argument: its text} from the `Args:` lists of the docstrings `_docstrings` names (the nearest
    class's text wins)."""
    out = {}
    for doc in _docstrings(obj):
        lines = inspect.cleandoc(doc or "").splitlines()
        for i, line in enumerate(lines):
            if line.strip() != "Args:":
                continue
            current, indent = None, None
            for entry in lines[i + 1:]:
                if not entry.strip():
                    continue
                depth = len(entry) - len(entry.lstrip())
                if indent is None:
                    indent = depth
                if depth < indent or (depth == indent and re.fullmatch(r"[A-Z]\w*( \w+)?:", entry.strip())):
                    break   # the list's end, or the next section (Returns:, Raises:)
                # `name: text`, `name (type): text` or `a, b: text` (one text for several arguments)
                m = re.match(r"\s*(\w+(?:, \w+)*)\s*(\([^)]*\))?:\s*(.*)", entry) if depth == indent else None
                if m:
                    current = m.group(1).split(", ")
                    for name in current:
                        out.setdefault(name, m.group(3).strip())
                elif current:
                    for name in current:
                        out[name] = (out[name] + " " + entry.strip()).strip()
    return out


def type_name(annotation):
    """An annotation as the page names it: `str`, `str | list`, `list[int]`; a Literal by the type of
    its values (the values themselves are the `allowed` part)."""
    if annotation is inspect.Parameter.empty:
        return ""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(dict.fromkeys(type(a).__name__ for a in args))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args if a is not type(None))
    if origin is not None:
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]" if args else origin.__name__
    return getattr(annotation, "__name__", str(annotation))


def allowed_text(annotation):
    """The closed set a Literal annotation declares (what engine/config.py checks), '' when open."""
    values, per_item = config.choices(annotation)
    if values is None:
        return ""
    return ("items from " if per_item else "") + ", ".join(code(yaml_value(v)) for v in values)


def type_cell(kind, allowed):
    """The `type / allowed` cell: the type in code (a union's members each, joined by `or`: a `|` would
    split the table's cell), then what it is restricted to."""
    kinds = " or ".join(code(k) for k in kind.split(" | "))
    return kinds + (f": {allowed}" if allowed else "")


def annotation_of(p):
    """A parameter's annotation, else the type of its default (what engine/config.py checks too)."""
    if p.annotation is inspect.Parameter.empty and p.default not in (inspect.Parameter.empty, None):
        return type(p.default)
    return p.annotation


def arguments(obj):
    """The keyword arguments a recipe can set (what engine/config.py checks against)."""
    return [p for p in inspect.signature(obj).parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def signature_rows(obj):
    """(rows of the argument table, takes **kwargs)."""
    docs = arg_docs(obj)
    rows = []
    for p in arguments(obj):
        annotation = annotation_of(p)
        default = "required" if p.default is inspect.Parameter.empty else code(yaml_value(p.default))
        rows.append([code(p.name), type_cell(type_name(annotation), allowed_text(annotation)), default,
                     prose(docs.get(p.name, ""))])
    return rows, any(p.kind == p.VAR_KEYWORD for p in inspect.signature(obj).parameters.values())


def undocumented():
    """[(registry kind, component name, argument)] of the component arguments without a meaning."""
    return [(reg.kind, name, p.name) for reg in KINDS for name in reg.names()
            for p in arguments(reg.get(name)) if not arg_docs(reg.get(name)).get(p.name)]


def _rel(obj):
    """The repository path of the file defining `obj` (a module, class or function)."""
    return os.path.relpath(inspect.getsourcefile(obj), _bootstrap.ROOT).replace(os.sep, "/")


def engine_section(heading, covers, module, name):
    lines = [f"## {heading}", "", f"`{covers}` ([{name}](../{_rel(module)})).", ""]
    rows = []
    for key, meaning, rule in table_entries(module, name):
        spec = getattr(module, name)[key]
        rows.append([code(key), type_cell(spec[0].__name__, rule_text(rule, module)), code(yaml_value(spec[1])),
                     prose(meaning)])
    return lines + table(["key", "type / allowed", "default", "meaning"], rows) + [""]


def top_section():
    sections = {key: [kind_heading(reg)] for key, reg in COMPONENT_KEYS.items()}
    for heading, *_ in ENGINE_SECTIONS:
        sections.setdefault(heading, []).insert(0, heading)
    rows = []
    for key, meaning, _ in table_entries(config, "TOP_KEYS"):
        rows.append([code(key), prose(meaning), ", ".join(f"[{h}](#{slug(h)})" for h in sections.get(key, []))])
    splits = [[code(s), prose(m)] for s, m, _ in table_entries(config, "SPLITS")]
    return (["## Top-level keys", "",
             "A recipe's top level takes these keys and no others; `_base_` (inheritance) is read before "
             "validation and is not part of the loaded config.", ""]
            + table(["key", "meaning", "reference"], rows)
            + ["", "`reader` holds one mapping per split:", ""]
            + table(["split", "meaning"], splits)
            + [""])


def component_sections():
    nested = ", ".join(f"`{key}` ([{kind_heading(reg)}](#{slug(kind_heading(reg))}))"
                       for key, reg in sorted(config.NESTED.items()))
    lines = ["## Components", "",
             "A component section selects a registered class with `name:`; its other keys are that class's "
             "keyword arguments, checked against the signature below (an unknown key, a value of the wrong "
             "type or one outside the allowed values is an error naming the key). The sections: "
             + ", ".join(f"`{k}` ([{kind_heading(r)}](#{slug(kind_heading(r))}))" for k, r in COMPONENT_KEYS.items())
             + f". Keys holding components inside a component: {nested}. "
             "A reader split takes its reader's arguments and the DataLoader keys of [reader](#reader); "
             "`seed` is filled in from `runtime.seed` when the split does not set it.", ""]
    for reg in KINDS:
        lines += [f"## {kind_heading(reg)}", ""]
        lines += [", ".join(f"[{n}](#{slug(component_heading(n, reg))})" for n in reg.names()), ""]
        for name in reg.names():
            obj = reg.get(name)
            lines += [f"### {component_heading(name, reg)}", ""]
            text = summary(obj)
            lines += [(prose(text) + " " if text else "") + f"Defined in [{_rel(obj)}](../{_rel(obj)}).", ""]
            rows, kwargs = signature_rows(obj)
            if rows:
                lines += table(["argument", "type / allowed", "default", "meaning"], rows) + [""]
            else:
                lines += ["No arguments besides `name`.", ""]
            if kwargs:
                lines += ["Other keys are passed on unchecked (`**kwargs`).", ""]
    return lines


def render():
    """The page's text."""
    components.load_all()
    bare = undocumented()
    if bare:
        raise SystemExit("tools/config_reference.py: component arguments without a meaning (add `name: meaning.` "
                         "to the Args: of the class docstring): "
                         + ", ".join(f"{kind} {name}: {arg}" for kind, name, arg in bare))
    missing = [r.kind for r in vars(registry).values() if isinstance(r, registry.Registry) and r not in KINDS]
    if missing:
        raise SystemExit(f"tools/config_reference.py: add the registries of kind {', '.join(missing)} to KINDS")
    lines = ["# Config reference", "",
             "Generated by [tools/config_reference.py](../tools/config_reference.py) from the code: the key "
             "tables of [engine/config.py](../engine/config.py) (a key's meaning is its comment there) and the "
             "registered components' signatures and docstrings (an argument's meaning is its line in the `Args:` "
             "of its class docstring, or of a base class's; a closed set of values is its `typing.Literal` "
             "annotation). Do not edit it by hand: change the code, then "
             "run `python tools/config_reference.py` (`--check` tells whether the page is current). "
             "How recipes are written, merged and overridden: [Configs](configs.md).", ""]
    lines += top_section()
    for section in ENGINE_SECTIONS:
        lines += engine_section(*section)
    lines += component_sections()
    return "\n".join(lines).rstrip("\n") + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="exit 1 if the page differs from what the code gives")
    p.add_argument("--page", default=PAGE, help="the page to write or check, relative to the repository unless absolute "
                                            "(default docs/config-reference.md)")
    args = p.parse_args()
    text = render()
    path = os.path.join(_bootstrap.ROOT, args.page)   # an absolute --page stays as it is
    if args.check:
        current = open(path, encoding="utf-8").read() if os.path.isfile(path) else None
        if current != text:
            print(f"{args.page} is stale (differs from the code): run python tools/config_reference.py",
                  file=sys.stderr)
            sys.exit(1)
        print(f"{args.page} is current")
        return
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    print(f"wrote {args.page}")


if __name__ == "__main__":
    cli.run(main)
