"""No two modules of the package import each other, directly or through others, at the top or
inside a function: a circle works only in the order Python happens to meet it, and hides which
module depends on which."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def package_modules() -> dict[str, Path]:
    """Every module of the installed package (pyproject's package-dir), by its dotted name."""
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    section = pyproject.split("[tool.setuptools.package-dir]", 1)[1].split("\n[", 1)[0]
    modules = {}
    for package, folder in re.findall(r'^"([\w.]+)" = "([\w/]+)"$', section, flags=re.MULTILINE):
        for path in (REPO / folder).glob("*.py"):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules `name` imports anywhere in its file, but for `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
            target = node.module or "" if node.level == 0 else ".".join(filter(None, [base, node.module]))
            found |= {target} | {f"{target}.{alias.name}" for alias in node.names}
    return found & modules.keys()


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that reach each other (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in edges[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(group) > 1:
                found.append(sorted(group))

    for module in edges:
        if module not in index:
            visit(module)
    return found


def test_the_checker_finds_a_circle_through_a_third_module() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_of_the_package_imports_itself_through_others() -> None:
    modules = package_modules()
    assert "minigpt.training.lit" in modules and "minigpt.data.tokenizer.gpt2" in modules
    edges = {name: imported(name, path, modules) for name, path in modules.items()}
    assert "minigpt.data.tokenizer.pretokens" in edges["minigpt.data.tokenizer.gpt2"]
    assert circles(edges) == []
