"""Packaging beyond pyproject.toml: the browser playground ships in the wheel.

Its files live in playground/ at the top of the repository; building the
package copies the ones the server serves into keyturn/playground_assets/.
Keep SERVED_PATTERNS in step with keyturn/http/playground.py.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SOURCE = Path(__file__).resolve().parent / "playground"
SERVED_PATTERNS = ("*.html", "*.css", "*.js", "*.svg", "vendor/*.js")


class BuildPyWithPlayground(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install serves playground/ itself
        target = Path(self.build_lib, "keyturn", "playground_assets")
        for pattern in SERVED_PATTERNS:
            for path in sorted(SOURCE.glob(pattern)):
                dest = target / path.relative_to(SOURCE)
                self.mkpath(str(dest.parent))
                self.copy_file(str(path), str(dest))


setup(cmdclass={"build_py": BuildPyWithPlayground})
