"""The house's import arrows point one way: core <- plugins <- applications.

Every module is parsed (not imported), so an import inside a function counts as much as
one at the top. The core (`arc_warp`, its command line included) may import the standard
library, warp, numpy and itself; a plugin may also import its own optional dependency but
no application; nothing imports an application except the application itself.
"""

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
STDLIB = set(sys.stdlib_module_names)

# package folder -> top-level modules its files may import besides the standard library.
ALLOWED = {
    "arc_warp": {"warp", "numpy", "arc_warp"},
    "plugins/arc_warp_torch": {"warp", "numpy", "arc_warp", "arc_warp_torch", "torch"},
    "plugins/arc_warp_newton": {"warp", "numpy", "arc_warp", "arc_warp_newton", "newton"},
    "plugins/arc_warp_trimesh": {"warp", "numpy", "arc_warp", "arc_warp_trimesh", "trimesh"},
    # INRIA's module name over the torch plugin's drop-in, and nothing else.
    "plugins/inria_shim": {"arc_warp_torch"},
    "plugins/inria_shim_2023": {"arc_warp_torch"},
}


def imported_roots(path: pathlib.Path) -> set[str]:
    """Top-level names of every absolute import in a Python file."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


# Examples are leaves (nothing imports them): they may also use the app extras for pictures.
EXAMPLE_EXTRAS = {"PIL", "matplotlib", "tqdm"}


def layer_violations(package: str, allowed: set[str]) -> list[str]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        extras = EXAMPLE_EXTRAS if "examples" in path.relative_to(ROOT).parts else set()
        for root in sorted(imported_roots(path) - STDLIB - allowed - extras):
            found.append(f"{path.relative_to(ROOT)} imports {root}")
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_its_layer(package):
    assert layer_violations(package, ALLOWED[package]) == []


def test_checker_sees_a_forbidden_import(tmp_path, monkeypatch):
    # The check above must be able to fail: a core module importing a plugin is caught,
    # also when the import hides inside a function.
    bad = tmp_path / "arc_warp" / "bad.py"
    bad.parent.mkdir()
    bad.write_text("def f():\n    from arc_warp_torch import rasterization\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert layer_violations("arc_warp", ALLOWED["arc_warp"]) == [
        "arc_warp/bad.py imports arc_warp_torch"]


def test_core_and_its_command_line_load_without_torch_or_plugins():
    code = ("import sys, arc_warp, arc_warp.cli\n"
            "arc_warp.cli.build_parser()\n"
            "loaded = sorted(m for m in ('torch', 'newton', 'arc_warp_torch', 'arc_warp_newton')"
            " if m in sys.modules)\n"
            "print(','.join(loaded))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""


# Folders outside the core whose files may not import its private modules (arc_warp._src):
# they use the public API. tests/ is white-box by design and may.
PUBLIC_ONLY = ("plugins", "apps", "benchmarks", "scenes")


def private_imports(root: pathlib.Path) -> list[str]:
    """``path: module`` for each import of ``arc_warp._src`` (or a name from it) under the
    PUBLIC_ONLY folders of ``root``."""
    found = []
    for folder in PUBLIC_ONLY:
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
                else:
                    continue
                found += [f"{path.relative_to(root)}: {name}" for name in names
                          if name == "arc_warp._src" or name.startswith("arc_warp._src.")]
    return found


def test_nothing_outside_the_core_imports_its_private_modules():
    assert private_imports(ROOT) == []


def test_public_only_names_every_folder_of_python_outside_the_core():
    # an unlisted folder would go unchecked, and a listed one that is gone says the list is stale
    # (build/ and dist/ hold copies of the core made by packaging; hidden folders are tools' own)
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")
               and p.name not in ("build", "dist") and any(p.rglob("*.py"))}
    assert folders == {"arc_warp", "tests", *PUBLIC_ONLY}


def test_private_import_checker_can_fail(tmp_path):
    bad = tmp_path / "plugins" / "p.py"
    bad.parent.mkdir()
    bad.write_text("def f():\n    from arc_warp._src.splat import render\nimport arc_warp._src.camera\n")
    assert sorted(private_imports(tmp_path)) == ["plugins/p.py: arc_warp._src.camera", "plugins/p.py: arc_warp._src.splat",
                                                 "plugins/p.py: arc_warp._src.splat.render"]
