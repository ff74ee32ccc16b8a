"""Objects are composed of parts, not mixins sharing ``self`` (docs/workers.md, "The registry's parts"), read from the
source with ``ast`` (no module is imported):

(a) no class of ``server/`` has two or more bases that are classes of the package;
(b) every ``self.X`` a class of ``server/`` reads is set in its own ``__init__`` (or is a method, property or
    class attribute of it or of its project bases; dataclass fields count, a bare annotation elsewhere does not);
(c) no import cycle among the package's modules, ``if TYPE_CHECKING:`` imports and lazy imports counted.

The ``PENDING`` sets name known exceptions; they are empty, and a stale entry fails the tests.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

import arch_imports as arch

SERVER = "xpufleet.server."

# Known exceptions, "module:Class" or a module name: none. Keep them empty; a stale entry fails the tests.
PENDING_BASES: set[str] = set()
PENDING_ATTRIBUTES: set[str] = set()
PENDING_CYCLE_MODULES: set[str] = set()


@dataclass
class ClassInfo:
    module: str
    name: str
    node: ast.ClassDef
    bases: list[str]  # the bases' last names (``a.B`` -> ``B``)
    members: set[str] = field(default_factory=set)  # methods, properties, class attributes
    init_sets: set[str] = field(default_factory=set)  # self.X assigned in __init__
    reads: dict[str, int] = field(default_factory=dict)  # self.X read -> first line

    @property
    def key(self) -> str:
        return f"{self.module}:{self.name}"


def _base_name(expr: ast.expr) -> str:
    if isinstance(expr, ast.Subscript):  # Generic[T], Protocol[T]
        expr = expr.value
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return expr.id if isinstance(expr, ast.Name) else ast.unparse(expr)


def _self_targets(node: ast.AST) -> set[str]:
    """The ``self.X`` names a statement assigns (plain, annotated, augmented, tuple targets, ``with``/``for``)."""
    out: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) \
                and isinstance(sub.value, ast.Name) and sub.value.id == "self":
            out.add(sub.attr)
    return out


def class_infos(module: str, tree: ast.Module) -> list[ClassInfo]:
    """Every class of one module: its bases, members, what its ``__init__`` sets and what it reads of ``self``."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        info = ClassInfo(module, node.name, node, [_base_name(b) for b in node.bases])
        fields_declared = any("dataclass" in ast.unparse(d) for d in node.decorator_list) \
            or bool({"NamedTuple", "TypedDict", "Protocol"} & set(info.bases))
        for item in node.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                info.members.add(item.name)
                if item.name == "__init__":
                    info.init_sets |= _self_targets(item)
                for sub in ast.walk(item):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Load) \
                            and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                        info.reads.setdefault(sub.attr, sub.lineno)
            elif isinstance(item, ast.Assign):
                info.members |= {t.id for t in item.targets if isinstance(t, ast.Name)}
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) \
                    and (item.value is not None or fields_declared):
                info.members.add(item.target.id)  # a bare annotation sets nothing, unless it declares a field
            elif isinstance(item, ast.ClassDef):
                info.members.add(item.name)
        out.append(info)
    return out


def _classes() -> list[ClassInfo]:
    out = []
    for module, path in arch.modules().items():
        if module.startswith(SERVER):
            out += class_infos(module, ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return out


def by_name(classes: list[ClassInfo]) -> dict[str, ClassInfo]:
    """Classes by name (a name defined twice: the first)."""
    out: dict[str, ClassInfo] = {}
    for c in classes:
        out.setdefault(c.name, c)
    return out


CLASSES = _classes()
BY_NAME = by_name(CLASSES)


def project_bases(info: ClassInfo, names: dict[str, ClassInfo]) -> list[ClassInfo]:
    """The bases that are classes of the package."""
    return [names[b] for b in info.bases if b in names and b != info.name]


def known(info: ClassInfo, names: dict[str, ClassInfo], seen: frozenset[str] = frozenset()) -> set[str] | None:
    """What ``self.X`` may read in ``info``; None when a base outside the package may define more."""
    if info.key in seen:
        return set()
    allowed = set(info.members) | info.init_sets
    for base in info.bases:
        if base in ("object", "Protocol", "Generic", "ABC", "NamedTuple", "TypedDict"):
            continue
        project = names.get(base)
        if project is None:
            return None  # e.g. an Exception or aiohttp class: its attributes are not in this source
        more = known(project, names, seen | {info.key})
        if more is None:
            return None
        allowed |= more
    return allowed


def unset_reads(info: ClassInfo, names: dict[str, ClassInfo]) -> list[str]:
    """``self.X (line N)`` for each attribute ``info`` reads that nothing sets (empty for Protocols and classes
    with a base outside the package)."""
    allowed = None if "Protocol" in info.bases else known(info, names)
    if allowed is None:
        return []
    return [f"self.{attr} (line {line})" for line, attr in sorted((ln, a) for a, ln in info.reads.items()
                                                                   if a not in allowed)]


def test_no_class_has_two_project_bases():
    offenders = {c.key: [b.name for b in project_bases(c, BY_NAME)] for c in CLASSES
                 if len(project_bases(c, BY_NAME)) >= 2}
    new = {k: v for k, v in offenders.items() if k not in PENDING_BASES}
    assert not new, "classes assembled from several project classes (make them parts given to __init__):\n" + \
        "\n".join(f"  {k}({', '.join(v)})" for k, v in sorted(new.items()))


def test_every_attribute_read_is_set_in_init():
    problems = {c.key: unset for c in CLASSES if (unset := unset_reads(c, BY_NAME))}
    new = {k: v for k, v in problems.items() if k not in PENDING_ATTRIBUTES}
    assert not new, "attributes read but never set in the class's own __init__ (set them there, or pass the " \
        "part in):\n" + "\n".join(f"  {k}: {', '.join(v)}" for k, v in sorted(new.items()))


def _graph_with_type_checking() -> dict[str, set[str]]:
    """module -> the package's modules it imports anywhere, ``if TYPE_CHECKING:`` blocks included."""
    mods = arch.modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = arch._resolve(name, is_package, node.level, node.module)
                subs = [f"{base}.{a.name}" for a in node.names]
                targets = subs if all(s in mods for s in subs) else [base, *subs]
            else:
                continue
            graph[name] |= {t for t in targets if t in mods and t != name}
    return graph


def test_no_import_cycle_counting_type_checking_imports():
    found = arch.cycles(_graph_with_type_checking())
    new = [c for c in found if not set(c) <= PENDING_CYCLE_MODULES]
    assert not new, "import cycles (TYPE_CHECKING imports counted; use a Protocol in the lower module):\n" + \
        "\n".join("  " + " <-> ".join(c) for c in new)


def test_pending_lists_are_not_stale():
    """Each PENDING entry still offends: one that no longer does is taken off its list."""
    bases = {c.key for c in CLASSES if len(project_bases(c, BY_NAME)) >= 2}
    attributes = {c.key for c in CLASSES if unset_reads(c, BY_NAME)}
    in_cycles = {m for c in arch.cycles(_graph_with_type_checking()) for m in c}
    stale = sorted((PENDING_BASES - bases) | (PENDING_ATTRIBUTES - attributes) | (PENDING_CYCLE_MODULES - in_cycles))
    assert not stale, f"these PENDING entries no longer offend: take them off: {stale}"


def test_the_checks_find_what_they_look_for():
    src = ("class A:\n    def __init__(self):\n        self.a = 1\n"
           "class B:\n    def f(self):\n        return self.b\n"
           "class C(A, B):\n    def __init__(self):\n        self.c = 2\n"
           "    def g(self):\n        return self.a + self.c + self.f() + self.nope\n")
    classes = class_infos("m", ast.parse(src))
    names = by_name(classes)
    assert [b.name for b in project_bases(names["C"], names)] == ["A", "B"]  # (a)
    assert unset_reads(names["A"], names) == []
    assert unset_reads(names["B"], names) == ["self.b (line 6)"]  # (b): read, never set
    assert unset_reads(names["C"], names) == ["self.nope (line 11)"]  # a base's __init__ and methods count
    mixin = class_infos("m", ast.parse("class M:\n    d: int\n    def f(self):\n        return self.d\n"))[0]
    assert unset_reads(mixin, {"M": mixin}) == ["self.d (line 4)"]  # an annotation is not an assignment
    fields = class_infos("m", ast.parse("@dataclass\nclass D:\n    d: int\n    def f(self):\n        return self.d\n"))
    assert unset_reads(fields[0], {"D": fields[0]}) == []
    assert arch.cycles({"x": {"y"}, "y": {"x"}, "z": {"x"}}) == [["x", "y"]]  # (c)
