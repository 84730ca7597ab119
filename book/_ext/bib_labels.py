"""One citation style in the text and the bibliography: author-year labels.

sphinxcontrib-bibtex cites in the text with one style (`bibtex_reference_style`) and
labels the bibliography with another (`bibtex_default_style`, a pybtex style whose
default labels are alpha-style, "CBI+23"), so a reader saw "[Chen et al., 2023]" in the
text and "[CBI+23]" in the list it links to. This extension registers

* a pybtex label style, `authoryear`, whose labels are "Chen et al., 2023" (one author:
  "Saxena, 2023"; two: "van der Vaart and Wellner, 1996"), with "a", "b", ... after the
  year when two entries of one bibliography would get the same label;
* a pybtex formatting style of the same name: pybtex's `unsrt` entries with those
  labels, sorted by author, year and title;
* a sphinxcontrib-bibtex referencing style, `authoryear_label`, that cites by that
  label in brackets, several citations separated by semicolons:
  "[Leviathan et al., 2023; Chen et al., 2023]".

`_config.yml` selects them (`bibtex_default_style: authoryear`,
`bibtex_reference_style: authoryear_label`), so the text and the list show the same
label, even where two works share authors and year.
"""

from __future__ import annotations

import string
from collections import Counter
from dataclasses import dataclass, field

from pybtex.plugin import register_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle
from sphinx.application import Sphinx
from sphinxcontrib.bibtex.plugin import register_plugin as register_bibtex_plugin
from sphinxcontrib.bibtex.style.referencing import BracketStyle
from sphinxcontrib.bibtex.style.referencing.label import LabelReferenceStyle


def _plain(latex: str) -> str:
    """A name as text: braces and LaTeX accents resolved ("{\\L}ukasz" -> "Łukasz")."""
    return Text.from_latex(latex).render_as("text").strip()


def author_year(entry) -> str:
    """The entry's label before disambiguation: "Chen et al., 2023"."""
    persons = entry.persons.get("author") or entry.persons.get("editor") or []
    names = [_plain(" ".join(person.prelast_names + person.last_names)) for person in persons]
    if not names:
        names = [_plain(entry.fields.get("organization") or entry.fields.get("title") or entry.key)]
    who = names[0] if len(names) == 1 else " and ".join(names) if len(names) == 2 else f"{names[0]} et al."
    year = entry.fields.get("year", "n.d.")
    return f"{who}, {year}"


class AuthorYearLabelStyle(BaseLabelStyle):
    """Labels "Author et al., year", made unique with a letter after the year."""

    def format_labels(self, sorted_entries):
        labels = [author_year(entry) for entry in sorted_entries]
        repeated = {label for label, count in Counter(labels).items() if count > 1}
        seen: Counter = Counter()
        for label in labels:
            if label in repeated:
                suffix = string.ascii_lowercase[seen[label]]
                seen[label] += 1
                label += suffix
            yield label


class AuthorYearStyle(UnsrtStyle):
    """pybtex's unsrt entries, labelled and sorted by author and year."""

    default_label_style = AuthorYearLabelStyle
    default_sorting_style = "author_year_title"


def _semicolons() -> BracketStyle:
    return BracketStyle(sep="; ")


@dataclass
class AuthorYearLabelReferenceStyle(LabelReferenceStyle):
    """Cite by the bibliography's own label: [Leviathan et al., 2023; Chen et al., 2023]."""

    bracket_parenthetical: BracketStyle = field(default_factory=_semicolons)
    bracket_textual: BracketStyle = field(default_factory=_semicolons)


register_plugin("pybtex.style.labels", "authoryear", AuthorYearLabelStyle)
register_plugin("pybtex.style.formatting", "authoryear", AuthorYearStyle)
register_bibtex_plugin("sphinxcontrib.bibtex.style.referencing", "authoryear_label",
                       AuthorYearLabelReferenceStyle)


def setup(app: Sphinx) -> dict:
    return {"parallel_read_safe": True, "parallel_write_safe": True}
