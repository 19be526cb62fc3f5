"""The figures convention of bench/tables.py: what ab.py compares and the smoke tests require."""
from __future__ import annotations

from bench.tables import Figure, number, parse


def test_left_aligned_cells_name_the_row_and_right_aligned_cells_are_figures():
    text = """progress text is ignored
| path | note | p50 ms | p99 ms |
|---|---|---:|---:|
| push | durable | 6.6 | 1,250.5 |
| bare |  | 1.4 | n/a |
"""
    assert parse(text) == [Figure("path", "push · durable", "p50 ms", 6.6),
                           Figure("path", "push · durable", "p99 ms", 1250.5),
                           Figure("path", "bare", "p50 ms", 1.4)]


def test_rows_named_alike_are_named_by_their_first_figure_column_in_the_whole_table():
    text = """| form | records/request | service | requests / CPU-s |
|---|---:|---|---:|
| columns | 1 | ingest | 1,750 |
| columns | 1,024 | ingest | 625 |
| rows | 1,024 | ingest + detectors | 276 |
"""
    assert [(f.row, f.column, f.value) for f in parse(text)] == [
        ("columns · ingest · records/request 1", "requests / CPU-s", 1750.0),
        ("columns · ingest · records/request 1,024", "requests / CPU-s", 625.0),
        ("rows · ingest + detectors · records/request 1,024", "requests / CPU-s", 276.0)]


def test_two_tables_stay_apart_by_their_first_header_cell():
    text = "| a | x |\n|---|---:|\n| r | 1 |\n\n| b | x |\n|---|---:|\n| r | 2 |\n"
    assert [(f.table, f.value) for f in parse(text)] == [("a", 1.0), ("b", 2.0)]


def test_a_cell_counts_by_the_number_it_starts_with():
    assert [number(c) for c in ("12.0 ms", "3 (0.25)", "88%", "-1e-3", "1,024", "n/a", "", "- 3")] == \
        [12.0, 3.0, 88.0, -0.001, 1024.0, None, None, None]


def test_no_table_no_figures():
    assert parse("bare uvicorn: 13,617 requests per CPU-second\n| not | a table |\n") == []
