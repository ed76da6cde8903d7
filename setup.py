"""Which packages the distribution holds (the rest of the metadata is in pyproject.toml).

Every package under ``taskq/`` is found, so a new subpackage cannot be left out of the
wheel, and so is every folder of data files (``taskq/engine/lua``: a namespace package to
setuptools, its files listed in pyproject.toml's package-data); ``cli/`` is installed as ``taskq.cli``. ``scripts/check-wheel.sh`` (in ``make
test``) builds the wheel, installs it into a fresh virtualenv and imports every module.
"""

from setuptools import find_namespace_packages, find_packages, setup

setup(
    packages=[
        *find_namespace_packages(include=["taskq", "taskq.*"], exclude=["*.__pycache__"]),
        "taskq.cli",
        *(f"taskq.cli.{name}" for name in find_packages("cli")),
    ],
    package_dir={"taskq.cli": "cli"},
)
