"""Markdown tables: what `md_table` writes, `read_md_table` reads back as text; a generated
section spliced between its markers."""

import pytest

from onboarding.common.tables import md_table, read_md_table, splice_generated


def test_a_table_reads_back_cell_for_cell_as_text():
    rows = [{"kind": "fully_cold", "first_token_s": 108.789, "note": "a | b"},
            {"kind": "warm", "first_token_s": 73.8, "note": ""}]
    back = read_md_table("intro line\n\n" + md_table(rows) + "\n")
    assert back == [{"kind": "fully_cold", "first_token_s": "108.8", "note": "a | b"},
                    {"kind": "warm", "first_token_s": "73.8", "note": ""}]


def test_no_table_is_no_rows():
    assert read_md_table("no table here") == []


def test_a_generated_section_is_replaced_between_its_own_markers_only():
    doc = ("intro\n<!-- generated: a -->\nold a\n<!-- end generated: a -->\nmiddle\n"
           "<!-- generated: b -->\nold b\n<!-- end generated: b -->\n")
    new = splice_generated(doc, "a", "new a\n| x |")
    assert new == doc.replace("old a", "new a\n| x |")
    assert splice_generated(new, "a", "new a\n| x |") == new
    with pytest.raises(ValueError, match="generated: c"):
        splice_generated(doc, "c", "body")
