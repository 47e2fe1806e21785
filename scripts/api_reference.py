"""Write docs/api.md, the API reference, from the docstrings of the public modules.

    python scripts/api_reference.py           # (re)write docs/api.md
    python scripts/api_reference.py --check   # exit 1 if docs/api.md is stale

Each public name (a module's ``__all__``) is documented once, in the module its
``__module__`` names (``flowy.errors.LeaseError``, ``flowy.storage.connect``); when that
is a private module, in the first listing module other than the package facade. Every
other module listing the same object gets a "see" link. Fields, enum members, constants
and type aliases are documented with attribute docstrings (a string literal right after
the assignment), read from the source with ``ast``.

The same walk finds undocumented parameters, fields and members (``find_gaps``);
``tests/test_api_docs.py`` fails on any.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import importlib
import inspect
import itertools
import re
import sys
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

# The documented modules, in the order of the reference. A package joins with one line
# per public module (its names come from the module's ``__all__``).
MODULES: list[str] = [
    "flowy",
    "flowy.storage",
    "flowy.storage.dialect",
    "flowy.errors",
    "flowy.operations",
    "flowy.types",
    "flowy.lifecycle",
    "flowy.stream_helpers",
    "flowy.live",
    "flowy.otel",
    "flowy.schedules",
    "flowy.memory",
    "flowy.sqlite",
    "flowy.testing",
]

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "api.md"

HEADER = """\
# API reference

Generated from the docstrings by `scripts/api_reference.py`: edit the docstrings, then
run `make docs`. A test fails when this page is stale or a public parameter, field or
enum member is undocumented.
"""

Member = tuple[str, type, Any]  # (name, the class that defines it, the raw attribute)


# --- reading the source: attribute docstrings and definitions -----------------------


class _Source:
    """The top-level and class-level definitions of every loaded module of the packages,
    with their attribute docstrings, read once with ``ast``."""

    def __init__(self, packages: Sequence[str]) -> None:
        self.packages = tuple(packages)
        self._trees: dict[str, tuple[str, ast.Module] | None] = {}

    def tree(self, module: str) -> tuple[str, ast.Module] | None:
        if module not in self._trees:
            loaded = sys.modules.get(module)
            path = getattr(loaded, "__file__", None)
            if path is None or not str(path).endswith(".py"):
                self._trees[module] = None
            else:
                text = Path(path).read_text(encoding="utf-8")
                self._trees[module] = (text, ast.parse(text))
        return self._trees[module]

    def modules(self) -> list[str]:
        """Every loaded module of the packages, sorted (deterministic search order)."""
        return sorted(
            name
            for name in list(sys.modules)
            if name.split(".")[0] in self.packages and self.tree(name) is not None
        )

    def class_node(self, cls: type) -> tuple[str, ast.ClassDef] | None:
        """The ``class`` statement of ``cls`` (its ``__module__`` may name a facade)."""
        for module in self.modules():
            found = self.tree(module)
            assert found is not None
            node = _find_class(found[1], cls.__qualname__.split("."))
            if node is not None and _resolve(sys.modules[module], cls.__qualname__) is cls:
                return found[0], node
        return None

    def assignment(self, module: ModuleType, name: str) -> tuple[str, ast.stmt, str] | None:
        """The module-level assignment that defines ``name`` (followed through
        re-exports), with its attribute docstring ("" if none)."""
        value = getattr(module, name)
        for candidate in [module.__name__, *self.modules()]:
            found = self.tree(candidate)
            if found is None:
                continue
            text, tree = found
            docs = _attribute_docs(tree.body)
            for stmt in tree.body:
                if name in _assigned_names(stmt) and (
                    getattr(sys.modules[candidate], name, None) is value
                ):
                    return text, stmt, docs.get(name, "")
        return None

    def attribute_docs(self, cls: type) -> dict[str, str]:
        """Attribute docstrings of ``cls`` and its bases in the packages (nearest wins)."""
        docs: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            if not self.owns(klass):
                continue
            found = self.class_node(klass)
            if found is not None:
                docs.update(_attribute_docs(found[1].body))
        return docs

    def owns(self, obj: object) -> bool:
        """Whether ``obj`` (a class or function) is defined in one of the packages."""
        module = getattr(obj, "__module__", None) or ""
        return module.split(".")[0] in self.packages


def _find_class(tree: ast.Module | ast.ClassDef, path: list[str]) -> ast.ClassDef | None:
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == path[0]:
            return stmt if len(path) == 1 else _find_class(stmt, path[1:])
    return None


def _resolve(module: ModuleType, qualname: str) -> object:
    obj: object = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


def _assigned_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return [stmt.target.id]
    if isinstance(stmt, ast.Assign):
        return [t.id for t in stmt.targets if isinstance(t, ast.Name)]
    if sys.version_info >= (3, 12) and isinstance(stmt, ast.TypeAlias):
        return [stmt.name.id]
    return []


def _attribute_docs(body: list[ast.stmt]) -> dict[str, str]:
    """``name -> docstring`` for each assignment directly followed by a string literal."""
    docs: dict[str, str] = {}
    for stmt, after in itertools.pairwise(body):
        if (
            isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            for name in _assigned_names(stmt):
                docs[name] = inspect.cleandoc(after.value.value)
    return docs


# --- what a public object is made of -------------------------------------------------


def is_record(cls: type) -> bool:
    """A dataclass, NamedTuple, TypedDict or msgspec-style ``Struct``."""
    return (
        _is_dataclass(cls)
        or (_subclass(cls, tuple) and hasattr(cls, "_fields"))
        or typing.is_typeddict(cls)
        or hasattr(cls, "__struct_fields__")
    )


def _is_dataclass(cls: type) -> bool:
    return dataclasses.is_dataclass(cls)


def _subclass(cls: type, base: type) -> bool:
    return issubclass(cls, base)  # (a plain bool: no narrowing of ``cls``)


def enum_members(cls: type) -> dict[str, enum.Enum] | None:
    """The members of an enum class by name; None for any other class."""
    if not _subclass(cls, enum.Enum):
        return None
    found: dict[str, enum.Enum] = dict(getattr(cls, "__members__", {}))
    return found


def record_fields(cls: type) -> list[str]:
    if _is_dataclass(cls):
        fields: tuple[dataclasses.Field[object], ...] = dataclasses.fields(cls)
        return [f.name for f in fields]
    for attribute in ("__struct_fields__", "_fields", "__annotations__"):
        found: Iterable[str] | None = getattr(cls, attribute, None)
        if found is not None:
            return list(found)
    return []


def is_protocol(cls: type) -> bool:
    return bool(getattr(cls, "_is_protocol", False))


def constructor_owner(cls: type, source: _Source) -> type | None:
    """The class of the package whose ``__init__`` builds ``cls``, or None (a builtin,
    ``object`` or a generated one: nothing to document)."""
    if is_protocol(cls) or enum_members(cls) is not None or is_record(cls):
        return None
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            return klass if source.owns(klass) else None
    return None


def members(cls: type, source: _Source) -> Iterator[Member]:
    """Public methods and properties of ``cls`` defined in the packages, sorted."""
    for name in sorted(dir(cls)):
        if name.startswith("_"):
            continue
        for klass in cls.__mro__:
            if name in vars(klass):
                raw = vars(klass)[name]
                if source.owns(klass) and _function_of(raw) is not None:
                    yield name, klass, raw
                break


def _function_of(raw: object) -> Callable[..., object] | None:
    """The function behind a method, static or class method, or property; else None."""
    inner: object = getattr(raw, "__func__", None) or getattr(raw, "fget", None) or raw
    return inner if inspect.isfunction(inner) else None


def signature_of(obj: Callable[..., object]) -> inspect.Signature | None:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


def checked_parameters(
    sig: inspect.Signature, *, method: bool, protocol: bool
) -> list[inspect.Parameter]:
    params = list(sig.parameters.values())
    if method and params and params[0].name in ("self", "cls"):
        params = params[1:]
    return [
        p
        for p in params
        if not p.name.startswith("_")
        and not (protocol and p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
    ]


def names(doc: str, name: str) -> bool:
    """Whether ``doc`` names ``name``: in double backticks, or as an ``Args:`` item."""
    if f"``{name}``" in doc:
        return True
    item = rf"^\s*\*{{0,2}}{re.escape(name)}(\s*\([^)]*\))?\s*:"
    return re.search(item, doc, re.MULTILINE) is not None


# --- collecting the public names ---------------------------------------------------


@dataclasses.dataclass
class Entry:
    """One public name as documented: in ``module`` (its home) or a link to it."""

    module: str
    name: str
    obj: Any
    home: str  # the module where it is documented

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"

    @property
    def home_qualname(self) -> str:
        return f"{self.home}.{self.name}"


def collect(modules: Sequence[ModuleType]) -> list[Entry]:
    """Every public name of ``modules`` in ``__all__`` order, each with its home."""
    listed: dict[tuple[str, int], list[str]] = {}
    for module in modules:
        for name in _public_names(module):
            listed.setdefault((name, id(getattr(module, name))), []).append(module.__name__)
    entries: list[Entry] = []
    for module in modules:
        for name in _public_names(module):
            obj = getattr(module, name)
            where = listed[(name, id(obj))]
            declared = getattr(obj, "__module__", None) if _is_api(obj) else None
            # Its own public module, else the first listing module but the facade.
            home = declared if declared in where else ([m for m in where if "." in m] or where)[0]
            entries.append(Entry(module.__name__, name, obj, home))
    return entries


def _public_names(module: ModuleType) -> list[str]:
    names_ = getattr(module, "__all__", None)
    if names_ is None:
        raise SystemExit(f"{module.__name__} has no __all__: list its public names there")
    return list(names_)


def _is_api(obj: object) -> bool:
    return inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isroutine(obj)


# --- the check ---------------------------------------------------------------------


def find_gaps(modules: Sequence[ModuleType], packages: Sequence[str] | None = None) -> list[str]:
    """Every undocumented name, parameter, field and enum member of ``modules``, one
    line per object: ``module.Name.method: param1, param2``."""
    source = _Source(packages or sorted({m.__name__.split(".")[0] for m in modules}))
    gaps: dict[str, list[str]] = {}
    seen: set[tuple[int, str]] = set()

    def report(where: str, what: str) -> None:
        gaps.setdefault(where, []).append(what)

    entries = [e for e in collect(modules) if e.module == e.home]
    public = {id(e.obj): e.qualname for e in entries if inspect.isclass(e.obj)}
    for entry in entries:
        obj, where = entry.obj, entry.qualname
        if inspect.isclass(obj):
            _check_class(obj, where, source, report)
            for name, owner, raw in members(obj, source):
                if (id(owner), name) in seen:
                    continue
                seen.add((id(owner), name))
                label = f"{public.get(id(owner), where)}.{name}"
                _check_member(obj, name, raw, label, report)
        elif _is_api(obj):
            doc = inspect.getdoc(obj) or ""
            if not doc:
                report(where, "no docstring")
            sig = signature_of(obj)
            if sig is not None:
                for p in checked_parameters(sig, method=False, protocol=False):
                    if not names(doc, p.name):
                        report(where, p.name)
        else:
            found = source.assignment(sys.modules[entry.module], entry.name)
            if found is None or not found[2]:
                report(where, "no docstring")
    return [f"{where}: {', '.join(what)}" for where, what in gaps.items()]


def _check_class(
    cls: type, where: str, source: _Source, report: Callable[[str, str], None]
) -> None:
    doc = inspect.getdoc(cls) or ""
    if not doc:
        report(where, "no docstring")
    attribute_docs = source.attribute_docs(cls)
    enum_ = enum_members(cls)
    if enum_ is not None:
        for member in enum_:
            if not attribute_docs.get(member) and not names(doc, member):
                report(where, member)
        return
    if is_record(cls):
        for name in record_fields(cls):
            if not name.startswith("_") and not attribute_docs.get(name) and not names(doc, name):
                report(where, name)
        return
    owner = constructor_owner(cls, source)
    sig = signature_of(cls) if owner is not None else None
    if owner is None or sig is None:
        return
    docs = [doc, inspect.getdoc(owner) or "", inspect.getdoc(vars(owner)["__init__"]) or ""]
    for p in checked_parameters(sig, method=False, protocol=False):
        if not any(names(d, p.name) for d in docs):
            report(where, p.name)


def _check_member(
    cls: type, name: str, raw: object, label: str, report: Callable[[str, str], None]
) -> None:
    # The docstrings of this member all the way up the MRO: an override is documented
    # by the method it overrides (a base class or a Protocol it subclasses).
    docs = [
        inspect.cleandoc(f.__doc__)
        for klass in cls.__mro__
        if name in vars(klass) and (f := _function_of(vars(klass)[name])) is not None and f.__doc__
    ]
    if not docs:
        report(label, "no docstring")
    if isinstance(raw, property):
        return
    func = _function_of(raw)
    sig = signature_of(func) if func is not None else None
    if sig is None:
        return
    protocol = any(is_protocol(k) for k in cls.__mro__ if name in vars(k))
    for p in checked_parameters(sig, method=not isinstance(raw, staticmethod), protocol=protocol):
        if not any(names(d, p.name) for d in docs):
            report(label, p.name)


# --- rendering ---------------------------------------------------------------------


def render(modules: Sequence[ModuleType], packages: Sequence[str] | None = None) -> str:
    """The whole reference page."""
    source = _Source(packages or sorted({m.__name__.split(".")[0] for m in modules}))
    entries = collect(modules)
    links = " · ".join(f"[`{m.__name__}`](#{anchor(m.__name__)})" for m in modules)
    out = [HEADER, f"Modules: {links}", ""]
    documented = {id(e.obj): e for e in entries if e.module == e.home and _is_api(e.obj)}
    for module in modules:
        out += [f"## {module.__name__}", ""]
        doc = inspect.getdoc(module)
        if doc:
            out += [markdown(doc), ""]
        for entry in (e for e in entries if e.module == module.__name__):
            out += [f"### {entry.qualname}", ""]
            if entry.home != entry.module:
                target = entry.home_qualname
                out += [f"The same object as [`{target}`](#{anchor(target)}).", ""]
                continue
            out += _render_entry(entry, source, documented)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).rstrip() + "\n"


def _render_entry(entry: Entry, source: _Source, documented: dict[int, Entry]) -> list[str]:
    obj = entry.obj
    if inspect.isclass(obj):
        return _render_class(obj, entry, source, documented)
    if _is_api(obj):
        sig = signature_of(obj)
        prefix = "async def " if inspect.iscoroutinefunction(obj) else "def "
        head = prefix + entry.name + (format_signature(sig) if sig else "(...)")
        return [*code(head), *paragraph(inspect.getdoc(obj))]
    found = source.assignment(sys.modules[entry.module], entry.name)
    if found is None:
        return [*code(f"{entry.name} = {clean_repr(obj)}"), ""]
    text, stmt, doc = found
    value = getattr(stmt, "value", None)
    if isinstance(obj, str | int | float | bytes | bool) and not _is_alias(stmt):
        shown = clean_repr(obj)
    else:
        shown = ast.get_source_segment(text, value) if value is not None else clean_repr(obj)
    return [*code(f"{entry.name} = {shown}"), *paragraph(doc)]


def _is_alias(stmt: ast.stmt) -> bool:
    annotation = getattr(stmt, "annotation", None)
    return isinstance(annotation, ast.Name | ast.Attribute) and ast.unparse(annotation).endswith(
        "TypeAlias"
    )


def _render_class(
    cls: type, entry: Entry, source: _Source, documented: dict[int, Entry]
) -> list[str]:
    owner = constructor_owner(cls, source)
    sig = signature_of(cls) if (owner is not None or is_record(cls)) else None
    bases = [b for b in cls.__bases__ if b is not object and b is not typing.Generic]
    head = "class " + entry.name + (format_signature(sig, returns=False) if sig else "")
    out = code(head)
    if bases:
        out += ["Bases: " + ", ".join(_link(b, documented) for b in bases), ""]
    out += paragraph(inspect.getdoc(cls))
    attribute_docs = source.attribute_docs(cls)
    enum_ = enum_members(cls)
    if enum_ is not None:
        out += ["**Members:**", ""]
        for name, member in enum_.items():
            out.append(_item(f"{name} = {clean_repr(member.value)}", attribute_docs.get(name, "")))
        out.append("")
    elif is_record(cls):
        hints: dict[str, object] = {}
        rows: list[str] = []
        for klass in reversed(cls.__mro__):
            hints.update(vars(klass).get("__annotations__", {}))
        for name in record_fields(cls):
            if name.startswith("_"):
                continue
            annotation = hints.get(name)
            label = name if annotation is None else f"{name}: {annotation_text(annotation)}"
            rows.append(_item(label, attribute_docs.get(name, "")))
        if rows:
            out += ["**Fields:**", "", *rows, ""]
    own: list[Member] = []
    inherited: dict[str, list[str]] = {}
    for name, klass, raw in members(cls, source):
        base = documented.get(id(klass))
        if klass is not cls and base is not None:
            inherited.setdefault(base.home_qualname, []).append(name)
        else:
            own.append((name, klass, raw))
    for name, _klass, raw in own:
        out += _render_member(cls, name, raw)
    for base_name, names_ in inherited.items():
        listed = ", ".join(f"`{n}`" for n in names_)
        out += [f"Inherited from [`{base_name}`](#{anchor(base_name)}): {listed}.", ""]
    return out


def _render_member(cls: type, name: str, raw: object) -> list[str]:
    func = _function_of(raw)
    assert func is not None
    doc = inspect.getdoc(getattr(cls, name)) if not isinstance(raw, property) else None
    doc = doc or inspect.getdoc(raw) or ""
    if not doc:
        # inspect.getdoc finds an overridden method's docstring only on the bases of
        # the defining class; walk the MRO of the documented one as the check does.
        for klass in cls.__mro__:
            f = _function_of(vars(klass).get(name))
            if f is not None and f.__doc__:
                doc = inspect.cleandoc(f.__doc__)
                break
    if isinstance(raw, property):
        sig = signature_of(func)
        kind = "property"
        returns = ""
        if sig is not None and sig.return_annotation is not inspect.Signature.empty:
            returns = ": " + annotation_text(sig.return_annotation)
        head = f"{kind} {name}{returns}"
    else:
        sig = signature_of(func)
        prefix = "async def " if inspect.iscoroutinefunction(func) else "def "
        if isinstance(raw, classmethod):
            prefix = "classmethod " + prefix
        elif isinstance(raw, staticmethod):
            prefix = "staticmethod " + prefix
        text = "(...)"
        if sig is not None:
            params = list(sig.parameters.values())
            if params and not isinstance(raw, staticmethod):
                sig = sig.replace(parameters=params[1:])
            text = format_signature(sig)
        head = prefix + name + text
    return [f"#### {cls.__name__}.{name}", "", *code(head), *paragraph(doc)]


def _link(cls: type, documented: dict[int, Entry]) -> str:
    entry = documented.get(id(cls))
    if entry is not None:
        return f"[`{entry.home_qualname}`](#{anchor(entry.home_qualname)})"
    return f"`{annotation_text(cls)}`"


def _item(label: str, doc: str) -> str:
    text = " ".join(markdown(doc).split("\n")) if doc else ""
    return f"- `{label}`" + (f": {text}" if text else "")


# --- text helpers ------------------------------------------------------------------


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def code(text: str) -> list[str]:
    return ["```text", text, "```", ""]


def paragraph(doc: str | None) -> list[str]:
    return [markdown(doc), ""] if doc else []


def annotation_text(annotation: object) -> str:
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type):
        return annotation.__qualname__
    return clean_repr(annotation).replace("typing.", "")


def clean_repr(value: object) -> str:
    """``repr`` without memory addresses; functions and classes by qualified name."""
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if inspect.isroutine(value) or inspect.isclass(value):
        module = getattr(value, "__module__", None)
        qualname = getattr(value, "__qualname__", repr(value))
        return f"{module}.{qualname}" if module and module != "builtins" else qualname
    return re.sub(r" at 0x[0-9A-Fa-f]+", "", repr(value))


def format_signature(sig: inspect.Signature, *, returns: bool = True) -> str:
    """``(a: int, *, b: str = 'x') -> None`` with annotations exactly as written."""
    parts: list[str] = []
    star = False
    params = list(sig.parameters.values())
    for i, p in enumerate(params):
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        text = p.name
        if p.kind is p.VAR_POSITIONAL:
            text, star = "*" + p.name, True
        elif p.kind is p.VAR_KEYWORD:
            text = "**" + p.name
        if p.annotation is not p.empty:
            text += ": " + annotation_text(p.annotation)
        if p.default is not p.empty:
            text += (" = " if p.annotation is not p.empty else "=") + clean_repr(p.default)
        parts.append(text)
        last_positional = i + 1 == len(params) or params[i + 1].kind is not p.POSITIONAL_ONLY
        if p.kind is p.POSITIONAL_ONLY and last_positional:
            parts.append("/")
    tail = ""
    if returns and sig.return_annotation is not sig.empty:
        tail = " -> " + annotation_text(sig.return_annotation)
    one_line = "(" + ", ".join(parts) + ")" + tail
    if len(one_line) <= 80:
        return one_line
    return "(\n" + "".join(f"    {part},\n" for part in parts) + ")" + tail


SECTIONS = re.compile(
    r"^(Args|Arguments|Attributes|Members|Raises|Returns|Yields|Note|Notes|Example|Examples):\s*$"
)
ITEM = re.compile(r"^(\*{0,2}[\w.]+)(\s*\(([^)]*)\))?\s*:\s*(.*)$")
ROLE = re.compile(r":(?:class|func|meth|mod|attr|exc|data|obj):`~?([^`]+)`")


def markdown(doc: str) -> str:
    """A Google-style docstring as Markdown: sections become bold labels, ``Args:``-like
    items a list, Sphinx roles code spans; everything else is kept."""
    doc = ROLE.sub(r"`\1`", doc)
    lines = doc.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        match = SECTIONS.match(line)
        if not match:
            # A reST literal block marker: "text::" becomes "text:", a lone "::" goes (the
            # indented block after it is a Markdown code block as it stands).
            if line.strip() != "::":
                out.append(line[:-2] + ":" if line.endswith("::") else line)
            i += 1
            continue
        section = match.group(1)
        block: list[str] = []
        i += 1
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" ")):
            block.append(lines[i])
            i += 1
        while block and not block[-1].strip():
            block.pop()
        out += [f"**{section}:**", ""]
        body = inspect.cleandoc("\n".join(block)).splitlines() if block else []
        if section in ("Args", "Arguments", "Attributes", "Members", "Raises"):
            out += _items(body)
        else:
            out += body
        if i < len(lines):
            out.append("")
    return "\n".join(out).strip()


def _items(body: list[str]) -> list[str]:
    items: list[str] = []
    for line in body:
        match = ITEM.match(line) if not line.startswith(" ") else None
        if match:
            name, _, kind, text = match.groups()
            label = f"`{name}` ({kind})" if kind else f"`{name}`"
            items.append(f"- {label}: {text}".rstrip())
        elif line.strip() and items:
            items[-1] += " " + line.strip()
        elif line.strip():
            items.append(line.strip())
    return items


# --- command line ------------------------------------------------------------------


def load(module_names: Sequence[str] = MODULES) -> list[ModuleType]:
    return [importlib.import_module(name) for name in module_names]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is stale")
    args = parser.parse_args(argv)
    text = render(load())
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(
                f"{OUTPUT.relative_to(ROOT)} is stale: run `make docs` and commit the result",
                file=sys.stderr,
            )
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
