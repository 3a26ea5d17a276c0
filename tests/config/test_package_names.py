"""Our top-level import names are ours alone: a package named like another distribution's (a top-level
`kernels`, which Hugging Face's `kernels` package, a dependency of transformers >= 5.25, also takes) shadows
it or is shadowed by it, depending on sys.path order."""

import importlib.metadata
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def _our_top_level_names() -> set[str]:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    names = {p.rstrip("*") for p in patterns["include"]}
    # hydra_plugins is Hydra's namespace package, shared by design with every installed Hydra plugin
    return (names - {"hydra_plugins"}) | {"run", "serve"}  # run, serve: the py-modules beside them


def test_no_other_installed_distribution_takes_our_import_names():
    others = importlib.metadata.packages_distributions()
    clashes = {name: dists for name in _our_top_level_names() if (dists := set(others.get(name, [])) - {"testbed"})}
    assert not clashes, f"import names taken by other installed distributions: {clashes}"


def test_the_kernels_package_is_importable_beside_hugging_faces():
    import testbed_kernels.reference

    assert Path(testbed_kernels.reference.__file__).resolve().is_relative_to(ROOT)
