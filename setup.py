"""Package discovery only (metadata lives in pyproject.toml).

``policies/`` and ``connectors/`` are top-level folders installed as
``kvstore.policies`` and ``kvstore.connectors``; find them so no list is kept by hand.
"""

from setuptools import find_packages, setup

packages = find_packages(include=["kvstore", "kvstore.*"]) + [
    f"kvstore.{name}"
    for name in find_packages(include=["policies", "policies.*", "connectors", "connectors.*"])
]

setup(packages=packages)
