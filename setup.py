"""Ship the documentation pages inside the package, so an installed plugin's Help link works.

The Markdown lives in ``docs/`` (where the repository and README link to it); a wheel built
from a checkout or from the sdist copies ``docs/*.md`` to ``napari_attnreg/docs/``, which
:func:`napari_attnreg.core.docs.docs_markdown` reads first. Everything else is in
pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DOCS = Path(__file__).resolve().parent / "docs"


class BuildWithDocs(build_py):
    """``build_py`` that also copies the documentation pages into the built package."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "napari_attnreg" / "docs"
        target.mkdir(parents=True, exist_ok=True)
        for page in sorted(DOCS.glob("*.md")):
            shutil.copyfile(page, target / page.name)


setup(cmdclass={"build_py": BuildWithDocs})
