"""The layout stays readable: small modules, typer only in the CLI, no import
cycles (imports inside functions count), no reaching into other modules'
private names, plumbing only at the package root, workflows (demo,
benchmarks) in ``workflows/`` and imported by the CLI alone, narrow library
signatures. A failure here names the file to split or the import to move."""

import ast
from pathlib import Path
from typing import Dict, List, Set

PACKAGE = Path(__file__).resolve().parents[1] / "spacy_genbioel"
#: counted on ruff-formatted code (one argument per line once a call passes 120 characters); a
#: spaCy-sized module reads better than one cut in two to fit a smaller cap
MAX_LINES = 900
#: the modules the package root may hold: its API and entry point, and plumbing
#: every layer uses; features live in subpackages, workflows in ``workflows/``
ROOT_MODULES = {"__init__", "__main__", "util", "ty", "progress", "arrayfile"}
WORKFLOWS = "spacy_genbioel.workflows"
MAX_PARAMETERS = 8


def modules() -> Dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imported_modules(path: Path, known: Set[str]) -> List[tuple]:
    """(module imported, names imported, line) for every spacy_genbioel import, at any depth."""
    result = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("spacy_genbioel"):
            names = [a.name for a in node.names]
            # `from spacy_genbioel.x import y` where y is itself a module
            submodules = [f"{node.module}.{n}" for n in names if f"{node.module}.{n}" in known]
            result.append((node.module, [n for n in names if f"{node.module}.{n}" not in known], node.lineno))
            result.extend((m, [], node.lineno) for m in submodules)
        elif isinstance(node, ast.Import):
            result.extend((a.name, [], node.lineno) for a in node.names if a.name.startswith("spacy_genbioel"))
    return result


def test_no_module_over_max_lines():
    long = {
        name: n
        for name, path in modules().items()
        if (n := len(path.read_text(encoding="utf8").splitlines())) > MAX_LINES
    }
    assert not long, f"split these by responsibility: {long}"


def test_package_root_holds_plumbing_only():
    extra = sorted(path.stem for path in PACKAGE.glob("*.py") if path.stem not in ROOT_MODULES)
    assert not extra, (
        f"the package root holds plumbing only ({sorted(ROOT_MODULES)}): move {extra} into a "
        f"subpackage (a workflow such as a demo or a benchmark into {WORKFLOWS.split('.')[-1]}/)"
    )


def test_workflows_are_imported_by_the_cli_only():
    known = set(modules())
    offenders = [
        f"{name}:{line} imports {module}"
        for name, path in modules().items()
        if not name.startswith(("spacy_genbioel.cli", WORKFLOWS))
        for module, _, line in imported_modules(path, known)
        if module == WORKFLOWS or module.startswith(WORKFLOWS + ".")
    ]
    assert not offenders, "the library never imports workflows/:\n" + "\n".join(offenders)


def _spacy_factory(node: ast.AST) -> bool:
    """A function decorated ``@Language.factory(...)``: its parameters are its config's keys."""
    return any(
        isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "factory"
        for d in getattr(node, "decorator_list", [])
    )


def test_library_functions_take_at_most_8_parameters():
    """Public library functions and constructors (not the CLI's commands, whose
    options are their interface, nor spaCy factories, whose parameters are their
    config's keys) take at most 8 parameters (``self``/``cls`` not counted): more
    settings go into one settings object."""
    wide = []
    for name, path in modules().items():
        if name.startswith("spacy_genbioel.cli"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf8"))):
            if (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and (not node.name.startswith("_") or node.name == "__init__")
                and not _spacy_factory(node)
            ):
                params = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
                n = len(params) - (1 if params and params[0].arg in ("self", "cls") else 0)
                if n > MAX_PARAMETERS:
                    wide.append(f"{name}.{node.name} ({n} parameters, line {node.lineno})")
    assert not wide, "group settings into a (frozen) settings object:\n" + "\n".join(wide)


def test_typer_only_in_the_cli_package():
    offenders = []
    for name, path in modules().items():
        if name.startswith("spacy_genbioel.cli"):
            continue
        tree = ast.parse(path.read_text(encoding="utf8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "typer" for a in node.names):
                offenders.append(name)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "typer":
                offenders.append(name)
    assert not offenders, f"library modules import typer: {offenders}"


def test_every_module_says_what_it_owns():
    missing = [
        name
        for name, path in modules().items()
        if path.read_text(encoding="utf8").strip()
        and ast.get_docstring(ast.parse(path.read_text(encoding="utf8"))) is None
    ]
    assert not missing, f"modules without a docstring: {missing}"


def test_no_private_names_imported_across_modules():
    known = set(modules())
    offenders = []
    for name, path in modules().items():
        for module, names, line in imported_modules(path, known):
            private = [n for n in names if n.startswith("_") and n != "__version__"]
            if private and module != name:
                offenders.append(f"{name}:{line} imports {private} from {module}")
    assert not offenders, "\n".join(offenders)


def test_no_import_cycles():
    known = set(modules())
    graph: Dict[str, Set[str]] = {name: set() for name in known}
    for name, path in modules().items():
        for module, _, _ in imported_modules(path, known):
            # importing a.b.c runs a.b's __init__ too: every enclosing package is a target
            parts = module.split(".")
            for end in range(2, len(parts) + 1):
                target = ".".join(parts[:end])
                # a module importing its own package's siblings through the package is not a cycle
                if target in known and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    cycles = []
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles[:10])
