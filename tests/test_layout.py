"""The package layout of the README: data flows one way through ``garlic``'s packages, and none imports back up."""

import ast
import graphlib
from pathlib import Path

import garlic

# Lowest first: a module may import its own package and those before it, never one after it.
LAYERS = (
    "io",
    "sources",
    "metrics",
    "data",
    "config",
    "models",
    "training",
    "tracking",
    "explain",
    "methods",
    "evaluation",
    "runs",
    "studies",
    "inference",
    "live",
    "cli",
    "app",
)
PACKAGE = Path(garlic.__file__).parent


def layer_of(module: str) -> str:
    """``garlic.models.compact`` -> ``models``; ``garlic.cli`` -> ``cli``."""
    return module.split(".")[1]


def imported_modules(tree: ast.Module, top: str = "garlic") -> list[tuple[str, int]]:
    """Every ``top.*`` module (``garlic.*``) a module imports, with its line (lazy imports inside functions included)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == top:
            names = [f"{top}.{alias.name}" for alias in node.names] if node.module == top else [node.module]
            found += [(name, node.lineno) for name in names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names if alias.name.split(".")[0] == top]
    return found


def upward_imports(package: Path) -> list[str]:
    upward = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package.parent).with_suffix("")
        if relative.name == "__init__" and len(relative.parts) <= 2:
            continue
        module = ".".join(relative.parts)
        for imported, line in imported_modules(ast.parse(path.read_text())):
            if LAYERS.index(layer_of(imported)) > LAYERS.index(layer_of(module)):
                upward.append(f"{module} (line {line}) imports {imported}")
    return upward


def module_graph(package: Path) -> dict[str, set[str]]:
    """Each module of ``package`` -> the modules of the package it imports. Every import counts, those inside functions
    (and under ``TYPE_CHECKING``) too: an import deferred into a function defers when a circle bites, not whether the
    two modules need each other (the circle of 8 files through ``garlic.methods.saved`` was closed by a lazy import
    of the registry, and module-level imports alone showed none). ``from garlic.methods import registry`` is the
    module ``garlic.methods.registry``, a package's ``__init__`` the package."""
    top = package.name
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for module, path in modules.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == top:
                named = [f"{node.module}.{alias.name}" for alias in node.names]
                imported |= {name for name in named if name in modules} or {node.module}
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names if alias.name.split(".")[0] == top}
        graph[module] = {name for name in imported if name in modules} - {module}
    return graph


def import_circle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of imports in ``graph`` (its modules in import order, the first repeated last), or [] if none."""
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as circle:
        return list(reversed(circle.args[1]))
    return []


def test_every_package_and_top_module_has_a_layer():
    top = {path.stem for path in PACKAGE.glob("*.py") if path.stem != "__init__"}
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert top | packages == set(LAYERS)


def test_no_module_imports_a_later_layer():
    assert upward_imports(PACKAGE) == []


def test_the_check_reports_an_upward_import(tmp_path):
    # A model that imported the trainer, or lazily the registry, is reported; importing downwards is not.
    models = tmp_path / "garlic" / "models"
    models.mkdir(parents=True)
    (models / "bad.py").write_text(
        "from garlic.data.batches import Batch\nfrom garlic.training.trainer import Trainer\n\n\n"
        "def later():\n    from garlic import methods\n"
    )
    assert upward_imports(tmp_path / "garlic") == [
        "garlic.models.bad (line 2) imports garlic.training.trainer",
        "garlic.models.bad (line 6) imports garlic.methods",
    ]


def test_no_modules_import_each_other_in_a_circle():
    # Within a layer the layering allows any import; a circle there (garlic.methods had one of 8 files) means no
    # module of it can be read, tested or imported first on its own.
    assert import_circle(module_graph(PACKAGE)) == []


def test_the_check_reports_a_circle_closed_by_a_lazy_import(tmp_path):
    methods = tmp_path / "garlic" / "methods"
    methods.mkdir(parents=True)
    for name in ("__init__", "contract"):
        (methods / f"{name}.py").write_text("")
    (methods / "loader.py").write_text(
        "from garlic.methods.contract import x\n\n\ndef load():\n    from garlic.methods import kind\n"
    )
    (methods / "kind.py").write_text("from garlic.methods.loader import load\n")
    circle = import_circle(module_graph(tmp_path / "garlic"))
    assert set(circle) == {"garlic.methods.loader", "garlic.methods.kind"} and circle[0] == circle[-1]
    (methods / "loader.py").write_text("from garlic.methods import contract\n")  # the loader no longer needs a kind
    assert import_circle(module_graph(tmp_path / "garlic")) == []


def test_the_fit_loop_imports_no_model():
    # The loop is one module; GARLIC's schedules and the baselines' build their models and plug in as hooks.
    loop = PACKAGE / "training" / "trainer.py"
    imported = [name for name, _ in imported_modules(ast.parse(loop.read_text()))]
    assert imported and not [name for name in imported if layer_of(name) in ("models", "methods")]


def test_no_script_in_experiments_imports_another():
    # What two scripts share belongs to the package; a script's own modules (experiments/baselines/) are one script.
    experiments = PACKAGE.parent / "experiments"
    crossing = []
    for path in sorted(experiments.rglob("*.py")):
        script = path.relative_to(experiments).parts[0].removesuffix(".py")
        imported = imported_modules(ast.parse(path.read_text()), top="experiments")
        crossing += [
            f"{path.relative_to(experiments)} (line {line}) imports {name}"
            for name, line in imported
            if name.split(".")[1] != script
        ]
    assert crossing == []
