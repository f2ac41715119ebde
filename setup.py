"""Packaging beyond pyproject.toml: the browser playground and GraphiQL ship in the wheel.

Their files live in playground/ and graphiql/ at the top of the repository;
building the package copies the ones the server serves into
keyturn/playground_assets/ and keyturn/graphiql_assets/. Keep SERVED_PATTERNS
in step with keyturn/http/playground.py and GRAPHIQL_FILES with
keyturn/http/graphiql.py.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SOURCE = ROOT / "playground"
SERVED_PATTERNS = ("*.html", "*.css", "*.js", "*.svg", "vendor/*.js")
GRAPHIQL_SOURCE = ROOT / "graphiql"
GRAPHIQL_FILES = ("index.html", "vendor/graphiql.js", "vendor/graphiql.css")


class BuildPyWithPlayground(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install serves playground/ and graphiql/ themselves
        target = Path(self.build_lib, "keyturn", "playground_assets")
        for pattern in SERVED_PATTERNS:
            for path in sorted(SOURCE.glob(pattern)):
                self._copy(path, target / path.relative_to(SOURCE))
        target = Path(self.build_lib, "keyturn", "graphiql_assets")
        for name in GRAPHIQL_FILES:
            self._copy(GRAPHIQL_SOURCE / name, target / name)

    def _copy(self, path: Path, dest: Path) -> None:
        self.mkpath(str(dest.parent))
        self.copy_file(str(path), str(dest))


setup(cmdclass={"build_py": BuildPyWithPlayground})
