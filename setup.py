"""Package discovery for the folder layout (pyproject.toml holds everything else).

pyproject's ``package-dir`` maps each top-level folder to a sub-package of ``gdncheck``
(``reference/`` is ``gdncheck.reference``). setuptools' own discovery (``packages.find``) cannot
put a prefix in front of what it finds, so this finds the packages below each mapped root itself:
every folder with an ``__init__.py``. A new sub-package is in the wheel without anyone listing it;
tests/packaging/test_wheel_journey.py builds the wheel and compares its modules with the source tree's.
"""

import sys
from pathlib import Path

from setuptools import find_packages, setup

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10: the backport, a build requirement there (pyproject.toml)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent


def discover() -> list[str]:
    roots = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-dir"]
    packages = []
    for name, folder in roots.items():
        packages.append(name)
        packages += [f"{name}.{sub}" for sub in find_packages(str(ROOT / folder))]
    return sorted(set(packages))


setup(packages=discover())
