"""House rules on the code's shape that no linter checks: kernels/ has no class with more than
:data:`MAX_METHODS` methods (a class that grows past it does more than one job: split it)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_METHODS = 25


def classes_over(source: str, limit: int) -> list[tuple[str, int, int]]:
    """``(name, line, methods)`` of each class in ``source`` with more than ``limit`` methods:
    each ``def``/``async def`` in the class body (properties too; nested classes count apart)."""
    over: list[tuple[str, int, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            methods = sum(isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) for item in node.body)
            if methods > limit:
                over.append((node.name, node.lineno, methods))
    return over


def test_no_class_in_kernels_has_more_than_25_methods() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line} {name} has {methods} methods"
        for path in sorted((REPO / "kernels").rglob("*.py"))
        for name, line, methods in classes_over(path.read_text(encoding="utf-8"), MAX_METHODS)
    ]
    assert found == [], f"classes over {MAX_METHODS} methods (split them): {found}"


def test_the_size_check_counts_methods_and_coroutines_of_each_class() -> None:
    body = "".join(f"    def m{i}(self) -> None: ...\n    async def a{i}(self) -> None: ...\n" for i in range(13))
    source = f"class Big:\n{body}    x = 1\n\nclass Small:\n{body[: body.index('    async def a12')]}"
    assert classes_over(source, MAX_METHODS) == [("Big", 1, 26)]
