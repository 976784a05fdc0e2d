"""Markdown tables: what `md_table` writes, `read_md_table` reads back as text."""

from onboarding.tables import md_table, read_md_table


def test_a_table_reads_back_cell_for_cell_as_text():
    rows = [{"kind": "fully_cold", "first_token_s": 108.789, "note": "a | b"},
            {"kind": "warm", "first_token_s": 73.8, "note": ""}]
    back = read_md_table("intro line\n\n" + md_table(rows) + "\n")
    assert back == [{"kind": "fully_cold", "first_token_s": "108.8", "note": "a | b"},
                    {"kind": "warm", "first_token_s": "73.8", "note": ""}]


def test_no_table_is_no_rows():
    assert read_md_table("no table here") == []
