"""The package's import graph, read from the source with ``ast``: no cycles, a package ``__init__`` that imports
no model code, and a zoo that is a leaf (what the imports load at run time: tests/test_package.py).

Every ``import`` counts, module-level or inside a function: a function-level import that closes a cycle
is still a cycle a reader has to untangle. ``from keras_vit import X`` is an edge to the submodule
``keras_vit.X`` when there is one, else to the package ``keras_vit`` (its ``__init__``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.backend_independent  # files, names and checks: the same on every backend

REPO = Path(__file__).resolve().parents[1]
# Source folder -> the package it installs as (setup.cfg, package_dir).
PACKAGES = {"keras_vit": "keras_vit", "zoo": "keras_vit.zoo", "training": "keras_vit.training"}
ZOO_COMMAND = "keras_vit.zoo.__main__"  # the command line may compose the zoo and the models
# What the package __init__ imports: everything else is imported on first use (keras_vit/lazy.py).
INIT_IMPORTS = {"keras_vit.runtime", "keras_vit.lazy", "keras_vit.registration"}


def module_files(root: Path = REPO, packages: dict[str, str] = PACKAGES) -> dict[str, Path]:
    """``{module name: file}`` of every module of the package."""
    modules = {}
    for folder, package in packages.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module of the package that importing ``name`` runs: itself, or its closest parent package."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The absolute names an ``import`` statement imports (``from a import b`` -> ``a.b``, to try as a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: from the module's package, one level up per extra dot
        package = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


def import_graph(modules: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """``{module: the modules of the package it imports}``."""
    modules = module_files() if modules is None else modules
    graph = {}
    for module, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = _imported(node, module, path.name == "__init__.py")
            if isinstance(node, ast.ImportFrom):
                # `from a import b`: the submodule a.b if there is one, else a itself
                *members, base = names
                names = [name if name in modules else base for name in members]
            edges |= {target for name in names if (target := _resolve(name, modules)) and target != module}
        graph[module] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle ``[a, b, ..., a]`` of ``graph``, or ``None`` (depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once explored
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """Module- and function-level, ``import a.b``, ``from a import b`` (submodule or name), relative imports."""
    files = {
        "__init__.py": "from keras_vit import sub\n",
        "sub/__init__.py": "from keras_vit.sub import one\n",
        "sub/one.py": "import numpy\nfrom keras_vit.sub import two\n",
        "sub/two.py": "def f():\n    from keras_vit import name_in_init\n",
        "sub/three.py": "from . import one\nfrom .two import f\nimport keras_vit.sub.one\n",
        "other/__init__.py": "",
        "other/four.py": "from keras_vit.sub.one import something\n",
    }
    for name, text in files.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    graph = import_graph(module_files(tmp_path, {"pkg": "keras_vit"}))
    assert graph == {
        "keras_vit": {"keras_vit.sub"},
        "keras_vit.sub": {"keras_vit.sub.one"},
        "keras_vit.sub.one": {"keras_vit.sub.two"},
        "keras_vit.sub.two": {"keras_vit"},
        "keras_vit.sub.three": {"keras_vit.sub.one", "keras_vit.sub.two"},
        "keras_vit.other": set(),
        "keras_vit.other.four": {"keras_vit.sub.one"},
    }
    assert find_cycle(graph) == ["keras_vit", "keras_vit.sub", "keras_vit.sub.one", "keras_vit.sub.two", "keras_vit"]


def test_the_real_graph_maps_the_installed_names():
    graph = import_graph()
    assert "keras_vit.zoo.download" in graph["keras_vit.zoo"]
    assert {"keras_vit.training.finetune", "keras_vit.checkpoints.load"} <= set(graph)
    assert "keras_vit.config" in graph["keras_vit.models"] and "keras_vit.variants" in graph["keras_vit.config"]


def test_find_cycle_reports_the_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("module", [m for m in module_files() if m.startswith("keras_vit.zoo") and m != ZOO_COMMAND])
def test_the_zoo_is_a_leaf(module):
    """The zoo imports only itself and ``keras_vit.files``: never model or checkpoint code, which asks the zoo."""
    foreign = {t for t in import_graph()[module] if not t.startswith("keras_vit.zoo") and t != "keras_vit.files"}
    assert not foreign, f"{module} imports {sorted(foreign)}"


def test_the_package_init_is_not_a_hub():
    graph = import_graph()
    assert graph["keras_vit"] == INIT_IMPORTS
    assert all(graph[module] <= INIT_IMPORTS for module in INIT_IMPORTS)


# An option is a field (config.py), the code that builds its layer, its key rule and the variants that set it.
OPTIONS = ("layer_scale_init", "qk_norm", "num_register_tokens", "fc_norm")


@pytest.mark.parametrize("option", OPTIONS)
def test_an_option_is_named_in_at_most_four_library_files(option):
    named = sorted(str(path.relative_to(REPO)) for path in module_files().values() if option in path.read_text())
    assert 1 <= len(named) <= 4, f"{option} is named in {len(named)} library files: {named}"


# The checkpoint pipeline's steps in order (issue 35): a module imports none of a later step.
PIPELINE = (
    ("keras_vit.checkpoints.source",),
    tuple(f"keras_vit.checkpoints.from_{name}" for name in ("timm", "huggingface", "keras_hub")),
    ("keras_vit.checkpoints.infer",),
    ("keras_vit.checkpoints.keymap",),
    ("keras_vit.checkpoints.load",),
)
WRITERS = {"keras_vit.checkpoints.timm", "keras_vit.checkpoints.keras_hub"}  # beside the pipeline: its inverse
CHECKPOINT_LEVELS = 4  # the checkpoints package, its __init__ included: at most this many modules in a chain


def package_levels(graph: dict[str, set[str]], package: str) -> dict[str, int]:
    """``{module: level}`` for the modules of ``package``: 1 for one that imports none of the others, else one more
    than the highest it imports (the graph has no cycles: :func:`test_no_import_cycles`)."""
    inside = {module for module in graph if module == package or module.startswith(package + ".")}
    levels: dict[str, int] = {}

    def level(module: str) -> int:
        if module not in levels:
            levels[module] = 1 + max((level(t) for t in graph[module] & inside), default=0)
        return levels[module]

    return {module: level(module) for module in sorted(inside)}


def test_package_levels_counts_the_longest_chain():
    graph = {"p": {"p.a"}, "p.a": {"p.b", "q"}, "p.b": set(), "p.c": {"p.b"}, "q": {"p"}}
    assert package_levels(graph, "p") == {"p": 3, "p.a": 2, "p.b": 1, "p.c": 2}


@pytest.mark.parametrize("step", range(len(PIPELINE)))
def test_a_pipeline_step_imports_no_later_step(step):
    """Nor a writer of foreign files (the inverse of a convert step)."""
    graph = import_graph()
    later = WRITERS | {module for modules in PIPELINE[step + 1 :] for module in modules}
    for module in PIPELINE[step]:
        assert module in graph, f"{module} is gone: update PIPELINE"
        assert not graph[module] & later, f"{module} imports a later step: {sorted(graph[module] & later)}"


def test_the_checkpoints_package_is_at_most_four_levels_deep():
    levels = package_levels(import_graph(), "keras_vit.checkpoints")
    deep = {module: level for module, level in levels.items() if level > CHECKPOINT_LEVELS}
    assert not deep, f"deeper than {CHECKPOINT_LEVELS} import levels: {deep}"
    assert levels["keras_vit.checkpoints.source"] == 1 and levels["keras_vit.checkpoints"] <= CHECKPOINT_LEVELS
