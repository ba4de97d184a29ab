"""The comparison logic of benchmarks/coverage_benchmark.py on tiny synthetic tables (no network,
no scan): label loading, rule-to-family mapping, line/near/scope matching and the counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.coverage_compare import (
    Record,
    compare,
    family_of,
    load_labels,
    scopes_agree,
    split_table,
    tabulate,
    total,
)

FILES = """# a comment line before the header
package\tversion\tpath\tsplit\tmodular\tfamilies\tsites\tnote
pkg\t1.0\tpkg/a.py\tdev\t-\tall\t3\t
pkg\t1.0\tpkg/b.py\ttest\t-\tall\t2\t
"""
SITES = """# comment
# another comment
package\tversion\tpath\tline\tfamily\tscope\tstatic\tnote
pkg\t1.0\tpkg/a.py\t10\tpaper.4\tA.forward\tyes\tsoftmax
pkg\t1.0\tpkg/a.py\t20\tpaper.6\tA.forward\tyes (through a helper)\tlinear + act
pkg\t1.0\tpkg/a.py\t40\trms-norm\tNorm.forward\tyes\tnorm
pkg\t1.0\tpkg/b.py\t5\tpaper.4\tf\tno: registry lookup\tsoftmax in a free function
pkg\t1.0\tpkg/b.py\t50\tpaper.9\tB.forward\tyes\tqkv
"""


@pytest.fixture
def tables(tmp_path: Path):
    (tmp_path / "files.tsv").write_text(FILES)
    (tmp_path / "sites.tsv").write_text(SITES)
    return load_labels(tmp_path / "sites.tsv", tmp_path / "files.tsv")


def record(path: str, line: int, family: str, scope: str = "", rule: str = "") -> Record:
    return Record("pkg", path, line, family, rule or family, scope)


def test_labels_take_their_split_from_their_file_and_parse_the_static_column(tables):
    files, labels = tables
    assert [f.split for f in files] == ["dev", "test"]
    by_line = {label.line: label for label in labels}
    assert by_line[10].split == "dev" and by_line[5].split == "test"
    assert by_line[20].static  # "yes (...)" is static
    assert not by_line[5].static and by_line[5].static_reason.startswith("no:")


def test_inconsistent_tables_are_refused(tmp_path: Path):
    (tmp_path / "files.tsv").write_text(FILES.replace("\t3\t", "\t4\t"))
    (tmp_path / "sites.tsv").write_text(SITES)
    with pytest.raises(ValueError, match="says 4 sites"):
        load_labels(tmp_path / "sites.tsv", tmp_path / "files.tsv")
    (tmp_path / "files.tsv").write_text(FILES)
    (tmp_path / "sites.tsv").write_text(SITES + "pkg\t1.0\tpkg/c.py\t1\tpaper.4\tf\tyes\tx\n")
    with pytest.raises(ValueError, match="in no labelled file"):
        load_labels(tmp_path / "sites.tsv", tmp_path / "files.tsv")


def test_rules_map_to_families_by_id_or_by_modern_name():
    assert family_of("paper.4", "softmax") == "paper.4"
    assert family_of("ext.2", "fused-distilbert-attention") == "ext.2"
    assert family_of("modern.1", "rms-norm") == "rms-norm"
    assert family_of("mine.7", "something-else") == "mine.7"


def test_scopes_agree_with_enclosing_scopes_only():
    assert scopes_agree("A.forward", "A.forward")
    assert scopes_agree("P.__call__.apply_rotary_emb", "P.__call__")
    assert not scopes_agree("A.forward", "A.forward_features")
    assert not scopes_agree("", "A.forward")


def test_matching_prefers_the_same_line_then_a_near_line_then_the_same_scope(tables):
    _, labels = tables
    records = [
        record("pkg/a.py", 10, "paper.4"),  # same line
        record("pkg/a.py", 22, "paper.6"),  # two lines off: near
        record("pkg/a.py", 47, "rms-norm", scope="Norm.forward"),  # far, same scope
        record("pkg/b.py", 5, "paper.6"),  # right line, wrong family: extra
        record("pkg/b.py", 50, "paper.9"),
        record("pkg/b.py", 51, "paper.9"),  # a second record for one label: extra
    ]
    result = compare(labels, records, tolerance=2)
    kinds = {(label.line, kind) for label, _, kind in result.matched}
    assert kinds == {(10, "line"), (20, "near"), (40, "scope"), (50, "line")}
    assert [(m.path, m.line) for m in result.missed] == [("pkg/b.py", 5)]
    assert sorted((e.family, e.line) for e in result.extra) == [("paper.6", 5), ("paper.9", 51)]


def test_a_second_record_in_the_scope_of_a_matched_label_is_a_part_not_an_extra(tables):
    _, labels = tables
    records = [
        record("pkg/b.py", 50, "paper.9", scope="B.forward"),
        record("pkg/b.py", 58, "paper.9", scope="B.forward"),  # q and k: one label, two records
        record("pkg/b.py", 70, "paper.9", scope="Other.forward"),  # another scope: extra
        record("pkg/b.py", 6, "paper.4", scope="f"),  # its label is matched by nothing else
    ]
    result = compare(labels, records, tolerance=2)
    assert [(label.line, part.line) for label, part in result.parts] == [(50, 58)]
    assert [e.line for e in result.extra] == [70]
    assert {label.line for label, _, _ in result.matched} == {50, 5}


def test_a_record_too_far_away_in_another_scope_does_not_match(tables):
    _, labels = tables
    result = compare(labels, [record("pkg/a.py", 23, "paper.6", scope="Other.forward")], 2)
    assert not result.matched
    assert len(result.extra) == 1 and len(result.missed) == len(labels)


def test_counts_per_package_family_and_split(tables):
    files, labels = tables
    records = [
        record("pkg/a.py", 10, "paper.4"),
        record("pkg/b.py", 5, "paper.4"),
        record("pkg/b.py", 7, "paper.4"),  # extra in the test split
    ]
    cells = tabulate(compare(labels, records), split_table(files))
    dev = cells[("pkg", "paper.4", "dev")]
    assert (dev.expected, dev.found, dev.matched, dev.precision, dev.recall) == (1, 1, 1, 1.0, 1.0)
    test = cells[("pkg", "paper.4", "test")]
    assert (test.expected, test.found, test.matched, test.missed, test.extra) == (1, 2, 1, 0, 1)
    assert test.precision == 0.5 and test.recall == 1.0
    assert test.expected_static == 0 and test.static_recall is None  # its only label is not static
    rms = cells[("pkg", "rms-norm", "dev")]
    assert (rms.expected, rms.found, rms.recall, rms.precision) == (1, 0, 0.0, None)
    everything = total(cells, lambda *_: True)
    assert (everything.expected, everything.found, everything.matched) == (5, 3, 2)
    assert everything.expected_static == 4 and everything.matched_static == 1


def test_a_test2_split_and_edge_labels_count_apart_in_the_clear_cut_recall(tmp_path: Path):
    files = FILES + "pkg\t1.0\tpkg/c.py\ttest2\t-\tall\t2\t\n"
    sites = (
        SITES
        + "pkg\t1.0\tpkg/c.py\t7\tgated-mlp\tC.forward\tyes\tplain\n"
        + "pkg\t1.0\tpkg/c.py\t30\tgated-mlp\tD.forward\tyes\t[edge] conv GLU\n"
    )
    (tmp_path / "files.tsv").write_text(files)
    (tmp_path / "sites.tsv").write_text(sites)
    loaded_files, labels = load_labels(tmp_path / "sites.tsv", tmp_path / "files.tsv")
    comparison = compare(labels, [record("pkg/c.py", 30, "gated-mlp", "D.forward")])
    cell = tabulate(comparison, split_table(loaded_files))[("pkg", "gated-mlp", "test2")]
    assert (cell.expected, cell.matched) == (2, 1)
    assert (cell.expected_clear, cell.matched_clear) == (1, 0) and cell.clear_recall == 0.0


def test_a_test3_split_is_tabulated_apart_from_the_other_splits(tmp_path: Path):
    files = (
        FILES
        + "pkg\t1.0\tpkg/c.py\ttest2\t-\tall\t1\t\n"
        + "pkg\t1.0\tpkg/d.py\ttest3\t-\tall\t2\t\n"
    )
    sites = (
        SITES
        + "pkg\t1.0\tpkg/c.py\t7\tpaper.4\tC.forward\tyes\tsoftmax\n"
        + "pkg\t1.0\tpkg/d.py\t8\tpaper.4\tD.forward\tyes\tsoftmax\n"
        + "pkg\t1.0\tpkg/d.py\t30\tconv-bn-act\tD.stem\tyes\t[edge] conv + BN in a submodule\n"
    )
    (tmp_path / "files.tsv").write_text(files)
    (tmp_path / "sites.tsv").write_text(sites)
    loaded_files, labels = load_labels(tmp_path / "sites.tsv", tmp_path / "files.tsv")
    assert [label.split for label in labels if label.path == "pkg/d.py"] == ["test3", "test3"]
    comparison = compare(labels, [record("pkg/d.py", 8, "paper.4", "D.forward")])
    cells = tabulate(comparison, split_table(loaded_files))
    softmax = cells[("pkg", "paper.4", "test3")]
    assert (softmax.expected, softmax.matched) == (1, 1)
    assert (
        cells[("pkg", "paper.4", "test2")].expected,
        cells[("pkg", "paper.4", "test2")].matched,
    ) == (1, 0)
    conv = cells[("pkg", "conv-bn-act", "test3")]
    assert (conv.expected, conv.matched, conv.expected_clear) == (1, 0, 0)
    assert conv.clear_recall is None
