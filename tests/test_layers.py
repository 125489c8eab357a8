"""The package's layering: each folder is one layer and imports point only down (imports inside functions
included, so a circle cannot hide behind a late import). `LAYERS` is the map a reader can trust."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hf_sparse_verify"

#: bottom to top; a module may import its own layer and the layers below it
LAYERS = (
    (
        "_version",
        "_logging",
        "_compat",
        "placement",
        "registry",
    ),  # leaves: no package imports but each other's
    ("kernels",),  # Triton ops, each with a torch-only reference
    ("step",),  # the typed per-step context and its slots
    ("sparse", "config"),  # settings, selection and step slots of lossy verification; the call's config
    ("attention",),  # the cache, the registered attention function, its backends
    ("integrations",),  # every module replacement and interface entry, and the one switch
    ("generation",),  # the engine, drafters, K policies, verification, the custom_generate entry
    ("drivers",),  # code that runs a model to measure something: calibrate, MoE damage, tune, step benchmarks
    ("cli", "hub", "__init__"),  # the command line and the package's public face
)
#: the one import that runs up a layer, with the reason (named in the issue's resolution)
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    for index, names in enumerate(LAYERS):
        if top in names:
            return index
    raise AssertionError(f"{module} is in no layer of LAYERS: add its folder there")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                if module.startswith("hf_sparse_verify"):
                    for alias in node.names:  # `from pkg import submodule` imports the submodule
                        sub = f"{module}.{alias.name}"
                        sub_path = PACKAGE.parent / sub.replace(".", "/")
                        is_module = (
                            sub_path.with_suffix(".py").exists() or (sub_path / "__init__.py").exists()
                        )
                        targets.add(sub if is_module else module)
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("hf_sparse_verify")}
        targets.discard(name)
    return graph


def test_imports_point_down():
    upward = []
    for module, targets in _imports().items():
        for target in targets:
            if _layer(target) > _layer(module) and (module, target) not in ALLOWED_UPWARD:
                upward.append(f"{module} -> {target}")
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(sorted(upward))


def test_no_import_circles():
    graph = _imports()
    # a package's __init__ re-exporting its own submodules is not a circle between modules
    edges = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}
    seen: dict[str, int] = {}  # 1: on the stack, 2: done
    circles = []

    def visit(node: str, stack: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if seen.get(nxt) == 1:
                circles.append(" -> ".join(stack[stack.index(nxt) :] + [node, nxt]))
            elif nxt not in seen:
                visit(nxt, stack + [node])
        seen[node] = 2

    for node in sorted(edges):
        if node not in seen:
            visit(node, [])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_kernel_references_import_only_torch():
    """A kernel's ``naive.py`` is the oracle its kernel is tested against: it depends on torch and other kernels'
    references only."""
    offenders = []
    for path in (PACKAGE / "kernels").glob("*/naive.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = ["." * node.level + (node.module or "")]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                reference = name.startswith("..") and name.endswith(".naive")
                if not reference and name.split(".")[0] not in {"torch", "__future__", "math", "typing"}:
                    offenders.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert not offenders, "\n".join(offenders)


def test_every_layer_exists():
    # a folder counts when it holds Python (a checkout may keep empty folders that a move left behind)
    tops = {
        p.name if p.is_dir() else p.stem
        for p in PACKAGE.iterdir()
        if not p.name.startswith((".", "__")) and (p.suffix == ".py" or (p.is_dir() and any(p.rglob("*.py"))))
    }
    tops -= {"default_model"}
    listed = {name for names in LAYERS for name in names}
    assert tops <= listed, f"folders or modules in no layer: {sorted(tops - listed)}"
