"""Install MathJax 3, RequireJS and the ipywidgets HTML manager for the offline book.

    python scripts/fetch_static_assets.py [--force]

Runs `npm install` into `_static_offline/.npm/` and copies the files the pages load
into `_static_offline/` (both ignored by git); book/_ext/offline_assets.py then serves
them from the built book. Without npm it prints why and exits 0: the book keeps
loading the three from their CDNs. Standard library only; it does not import specdec_ref.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATIC = ROOT / "_static_offline"
NPM_PREFIX = STATIC / ".npm"  # hidden: Sphinx does not copy dot-folders into the build
# The npm packages, with the version ranges the book was built with.
PACKAGES = ["mathjax@^3.2", "requirejs@^2.3", "@jupyter-widgets/html-manager@^1.0"]


def copy_assets(modules: Path, static: Path) -> list[str]:
    """Copy what the pages load from `node_modules` into `static`; return the entry files."""
    # MathJax: the whole es5 tree, since tex-chtml.js loads fonts and extensions lazily.
    shutil.copytree(modules / "mathjax" / "es5", static / "mathjax", dirs_exist_ok=True)
    (static / "requirejs").mkdir(exist_ok=True)
    shutil.copy2(modules / "requirejs" / "require.js", static / "requirejs" / "require.js")
    # The widget manager: the AMD bundle and the font files it references (not the
    # other bundles or the 6 MB source map).
    dist = modules / "@jupyter-widgets" / "html-manager" / "dist"
    (static / "html-manager").mkdir(exist_ok=True)
    for path in dist.iterdir():
        if path.name == "embed-amd.js" or path.suffix in {".woff", ".woff2", ".ttf", ".eot", ".svg"}:
            shutil.copy2(path, static / "html-manager" / path.name)
    return ["mathjax/tex-chtml.js", "requirejs/require.js", "html-manager/embed-amd.js"]


def installed_versions(modules: Path) -> dict[str, str]:
    """The version of each installed package, for the manifest."""
    names = ["mathjax", "requirejs", "@jupyter-widgets/html-manager"]
    return {name: json.loads((modules / name / "package.json").read_text())["version"] for name in names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="reinstall even if the assets are there")
    args = parser.parse_args(argv)

    manifest = STATIC / "manifest.json"
    if manifest.is_file() and not args.force:
        print(f"static: assets already in {STATIC.relative_to(ROOT)}/ (use --force to reinstall)")
        return 0
    npm = shutil.which("npm")
    if npm is None:
        print("static: npm not found; the book will load MathJax and the widget manager from their CDNs")
        return 0

    manifest.unlink(missing_ok=True)
    NPM_PREFIX.mkdir(parents=True, exist_ok=True)
    command = [npm, "install", "--no-audit", "--no-fund", "--no-save", "--ignore-scripts",
               "--prefix", str(NPM_PREFIX), *PACKAGES]
    print("static:", " ".join(command[1:]))
    result = subprocess.run(command, cwd=NPM_PREFIX)
    if result.returncode != 0:
        print("static: npm install failed; the book will load MathJax and the widget manager from their CDNs",
              file=sys.stderr)
        return 0
    modules = NPM_PREFIX / "node_modules"
    files = copy_assets(modules, STATIC)
    # Written last: book/_ext/offline_assets.py trusts the folder only once this exists.
    manifest.write_text(json.dumps({"files": files, "versions": installed_versions(modules)}, indent=2) + "\n")
    print(f"static: {', '.join(files)} ready in {STATIC.relative_to(ROOT)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
