"""The layout stays readable: small modules, typer only in the CLI, no import
cycles (imports inside functions count), no reaching into other modules'
private names. A failure here names the file to split or the import to move."""
import ast
from pathlib import Path
from typing import Dict, List, Set

PACKAGE = Path(__file__).resolve().parents[1] / "spacy_genbioel"
MAX_LINES = 500


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


def test_no_module_over_500_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text(encoding="utf8").splitlines())) > MAX_LINES}
    assert not long, f"split these by responsibility: {long}"


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
    missing = [name for name, path in modules().items()
               if path.read_text(encoding="utf8").strip() and ast.get_docstring(ast.parse(path.read_text(encoding="utf8"))) is None]
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
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles[:10])
