"""The code's layering, read from the source: the harness (``fafo.bench``) is imported by nothing below it, and the
methods and the harness use other modules' objects through what those modules make public."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BELOW_THE_HARNESS = ["fafo/*.py", "fafo/engine/*.py", "fafo/compress/*.py", "baselines/*.py", "tasks/*.py"]


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    return out | {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}


def foreign_private_attributes(path: Path, root: Path = REPO) -> list[str]:
    """``x._name`` where ``x`` is not ``self`` / ``cls`` and ``_name`` is not defined in this module (a method,
    class, function or attribute of its own). torch's ``torch._dynamo`` / ``torch._inductor`` namespaces (its
    documented compiler controls) are torch's public surface for what compiled steps need."""
    tree = ast.parse(path.read_text())
    own = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    own |= {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    own |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.endswith("_"):
            continue  # public, dunder, or a config key such as Hydra's _target_
        base = node.value
        while isinstance(base, ast.Attribute):
            base = base.value
        if isinstance(base, ast.Name) and base.id == "torch" or node.attr in own:
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_nothing_below_the_harness_imports_it():
    importers = [str(p.relative_to(REPO)) for pattern in BELOW_THE_HARNESS for p in sorted(REPO.glob(pattern))
                 if any(m == "fafo.bench" or m.startswith("fafo.bench.") for m in imports_of(p))]
    assert importers == []


def test_no_private_attribute_of_another_modules_object_in_the_methods_or_the_harness():
    files = sorted(REPO.glob("baselines/*.py")) + sorted(REPO.glob("fafo/bench/**/*.py"))
    assert [line for path in files for line in foreign_private_attributes(path)] == []


def test_the_check_sees_a_private_attribute_of_another_object(tmp_path):
    (tmp_path / "m.py").write_text("def f(engine):\n    engine._cache = None\n    return engine._flex\n")
    assert foreign_private_attributes(tmp_path / "m.py", tmp_path) == ["m.py:2: engine._cache", "m.py:3: engine._flex"]
