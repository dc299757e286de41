"""The layout's rule: imports run down the layers, never up, and every folder of the gateway is a package.

A module may import from its own layer and from any layer below it. The test names the file, the line and the
import that breaks the rule, so a newcomer sees where a concern should live instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"

# Lowest first. A package's subpackages belong to its layer.
LAYERS: list[tuple[str, ...]] = [
    ("gateway", "gateway.observe"),  # the root holds only SERVER_INFO
    ("gateway.protocol", "gateway.internals"),
    ("gateway.config",),
    ("gateway.catalog", "gateway.store"),
    ("gateway.policy",),
    ("gateway.relay",),
    ("gateway.upstream",),
    ("gateway.core",),
    ("gateway.downstream", "gateway.admin", "gateway.console"),
    ("gateway.app", "gateway.cli", "gateway.__main__"),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(GATEWAY.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    """The layer of the longest listed package that holds `module`."""
    best, best_len = -1, -1
    for index, packages in enumerate(LAYERS):
        for package in packages:
            inside = module == package or (package != "gateway" and module.startswith(package + "."))
            if inside and len(package) > best_len:
                best, best_len = index, len(package)
    return best


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    """Every gateway module the file of `module` imports (at any depth of the code), with its line."""
    found: list[tuple[int, str]] = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                full = f"{target}.{alias.name}"
                is_module = (GATEWAY.parent / (full.replace(".", "/") + ".py")).exists() or (
                    GATEWAY.parent / full.replace(".", "/")
                ).is_dir()
                found.append((node.lineno, full if is_module else target))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return [(line, name) for line, name in found if name == "gateway" or name.startswith("gateway.")]


def test_every_module_has_a_layer() -> None:
    unplaced = [module_name(p) for p in sorted(GATEWAY.rglob("*.py")) if layer_of(module_name(p)) < 0]
    assert unplaced == [], f"modules in no layer of LAYERS: {unplaced}"


def upward_imports(modules: list[tuple[Path, str]]) -> list[str]:
    """Each import in the files of `modules` (path, module name) of a module in a higher layer, as
    `file:line: what`."""
    upward = []
    for path, module in modules:
        mine = layer_of(module)
        shown = path.relative_to(GATEWAY.parent) if path.is_relative_to(GATEWAY) else path.name
        for line, target in imports_of(path, module):
            theirs = layer_of(target)
            if theirs > mine:
                upward.append(
                    f"{shown}:{line}: imports {target} "
                    f"(layer {theirs}: {', '.join(LAYERS[theirs])}) from layer {mine} ({', '.join(LAYERS[mine])})"
                )
    return upward


def test_imports_run_down_the_layers() -> None:
    upward = upward_imports([(path, module_name(path)) for path in sorted(GATEWAY.rglob("*.py"))])
    assert upward == [], "imports that run up the layers:\n" + "\n".join(upward)


def test_every_folder_is_a_package() -> None:
    folders = {p.parent for p in GATEWAY.rglob("*.py")}
    missing = sorted(str(f.relative_to(GATEWAY.parent)) for f in folders if not (f / "__init__.py").exists())
    assert missing == [], f"folders of the gateway without __init__.py: {missing}"


def test_the_check_catches_an_upward_import_and_a_module_out_of_place(tmp_path: Path) -> None:
    assert layer_of("gateway.upstream.transports.stdio") == layer_of("gateway.upstream")
    assert layer_of("gateway.loose_module") == -1, "a new module at the root must be placed in LAYERS"
    probe = tmp_path / "layers_probe.py"  # read as a config module reaching up to the hub
    probe.write_text("from gateway.core.registry import Registry\n")
    found = upward_imports([(probe, "gateway.config.layers_probe")])
    assert len(found) == 1 and "imports gateway.core.registry" in found[0] and "layers_probe.py:1" in found[0]
