"""Write the practical page `book/using-speculative-decoding.md` from its template.

The page's figures come from the committed reports in `specdec_ref/data`, through the
placeholders of `scripts/claims.py` (`{{data:...}}`, `{{calc:...}}`, `{{nb:...}}`) and the
calculations of `scripts/claims_calc.py`, so that no figure on it is typed by hand.

Usage: `python scripts/using_page.py --write` rewrites the page from
`scripts/using.in.md`; `--check` exits 1 and prints the difference when the committed
page is not what `--write` would write (`tests/test_claims.py` runs the check).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # claims.py lies beside this file
from claims import ROOT, Sources, fill, write_or_check  # noqa: E402

TEMPLATE = ROOT / "scripts" / "using.in.md"
PAGE = ROOT / "book" / "using-speculative-decoding.md"


def outputs(src: Sources, template: Path = TEMPLATE, page: Path = PAGE) -> dict[Path, str]:
    """{the page: the text --write gives it}."""
    return {page: fill(template.read_text(encoding="utf-8"), src)}


def main(argv: list[str] | None = None) -> int:
    """Write or check the page; 1 when --check finds it out of date, 2 on an unknown source."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", action="store_true", help="rewrite the page")
    group.add_argument("--check", action="store_true", help="exit 1 if the page differs from its sources")
    parser.add_argument("--data", type=Path, default=None, help="folder of the reports (default: the package's)")
    parser.add_argument("--template", type=Path, default=TEMPLATE)
    parser.add_argument("--page", type=Path, default=PAGE)
    args = parser.parse_args(argv)
    return write_or_check("using_page.py", args.write,
                          lambda: outputs(Sources(data=args.data), args.template, args.page))

if __name__ == "__main__":
    sys.exit(main())
