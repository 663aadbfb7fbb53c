"""The wheel holds every file of the source tree: setuptools installs only the packages pyproject.toml lists and
the data files its globs match, and an editable install (what the tests run) imports from the tree anyway, so only
this check sees one left out."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_pyproject_lists_every_package_of_the_source_tree():
    found = {".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "specchat").rglob("__init__.py")}
    assert found - set(SETUPTOOLS["packages"]) == set()


def test_every_data_file_of_the_source_tree_is_package_data():
    shipped = {path for name, globs in SETUPTOOLS["package-data"].items() for glob in globs
               for path in ROOT.joinpath(*name.split(".")).glob(glob)}  # fmt: skip
    data = {path for path in (ROOT / "specchat").rglob("*")
            if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts}  # fmt: skip
    assert data and data - shipped == set()
