"""nsadiag.store.owned: what in a directory is nsadiag's, and every place nsadiag removes,
moves or replaces entries keeps to it (the user's files are never touched)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nsadiag.harness.jobs import prepare_trial_dir
from nsadiag.rundir import (
    drop_left_aside,
    prepare_fresh_run_dir,
    prepare_run_dir,
    release_run_dir,
    write_json,
)
from nsadiag.store.owned import (
    ASIDE_PREFIX,
    MARKER_NAME,
    check_claimable,
    drop_earlier,
    foreign,
    is_run_dir,
    ours,
    remove_ours,
    restore_earlier,
    set_aside,
)


def _earlier_run(path: Path) -> None:
    """The files an earlier `nsadiag run` leaves, with the marker."""
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER_NAME).write_text("marked\n")
    for name in ("record.json", "report.md", "stdout.txt"):
        (path / name).write_text(f"earlier {name}\n")
    (path / "proc-7").mkdir()
    (path / "proc-7" / "events.jsonl").write_text("{}\n")


@pytest.mark.parametrize("name, is_dir, expected", [
    ("record.json", False, True), ("proc-12", True, True), ("trial-0", True, True),
    (".nsadiag.lock", False, True), ("profile.json.tmp", False, True),
    (".record.json.k3j9.tmp", False, True), (".write-test.ab12", False, True),
    ("run-redacted.tar.gz", False, True), (".nsadiag-earlier-x1", True, True),
    ("thesis.tex", False, False), ("data", True, False), ("record.json", True, False),
    ("proc-12", False, False), ("notes.tmp", False, False), ("ckpt.pt", False, False),
])
def test_ours_is_decided_by_name_and_kind(name, is_dir, expected):
    assert ours(name, is_dir) is expected


def test_a_directory_with_the_users_files_is_not_claimable(tmp_path):
    (tmp_path / "thesis.tex").write_text("x")
    (tmp_path / "data").mkdir()
    with pytest.raises(ValueError, match=r"already holds files nsadiag did not write "
                                         r"\(data/, thesis.tex\); nothing was touched"):
        check_claimable(tmp_path)
    with pytest.raises(ValueError, match="did not write"):
        prepare_run_dir(tmp_path)
    with pytest.raises(ValueError, match="did not write"):
        prepare_fresh_run_dir(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "thesis.tex"]


def test_many_foreign_files_are_counted_not_all_listed(tmp_path):
    for i in range(9):
        (tmp_path / f"f{i}.txt").write_text("x")
    with pytest.raises(ValueError, match=r"\(f0.txt, f1.txt, f2.txt, f3.txt and 5 more\)"):
        check_claimable(tmp_path)


def test_a_run_directory_from_before_the_marker_is_claimable(tmp_path):
    write_json(tmp_path / "record.json", {})
    (tmp_path / "trial-0").mkdir()
    assert is_run_dir(tmp_path) and foreign(tmp_path) == []
    check_claimable(tmp_path)
    prepare_run_dir(tmp_path)
    release_run_dir(tmp_path)
    assert (tmp_path / MARKER_NAME).is_file()


def test_a_marked_run_directory_with_the_users_files_is_claimable(tmp_path):
    _earlier_run(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    assert is_run_dir(tmp_path) and foreign(tmp_path) == ["notes.txt"]
    check_claimable(tmp_path)


def test_a_directory_without_records_is_not_a_run_directory(tmp_path):
    assert not is_run_dir(tmp_path)
    (tmp_path / "stdout.txt").write_text("x")
    assert not is_run_dir(tmp_path)  # no record file
    (tmp_path / "record.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("x")
    assert is_run_dir(tmp_path)  # a received run, to render: a record file, no marker
    with pytest.raises(ValueError, match=r"already holds files nsadiag did not write "
                                         r"\(notes.txt\)"):
        check_claimable(tmp_path)  # but not taken as --out: notes.txt is not nsadiag's


def test_set_aside_moves_only_the_earlier_runs_files_and_drop_removes_only_them(tmp_path):
    _earlier_run(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "report.md").write_text("mine too")
    aside = set_aside(tmp_path)
    assert aside is not None and aside.parent == tmp_path and \
        aside.name.startswith(ASIDE_PREFIX)
    assert sorted(p.name for p in aside.iterdir()) == ["proc-7", "record.json", "report.md",
                                                      "stdout.txt"]
    assert sorted(p.name for p in tmp_path.iterdir() if p != aside) == [
        MARKER_NAME, "data", "notes.txt"]
    (aside / "planted.txt").write_text("not nsadiag's")  # even here, kept
    drop_earlier(aside)
    assert sorted(p.name for p in aside.iterdir()) == ["planted.txt"]
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert (tmp_path / "data" / "report.md").read_text() == "mine too"


def test_restore_puts_the_earlier_run_back_and_keeps_the_users_files(tmp_path):
    _earlier_run(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    aside = set_aside(tmp_path)
    (tmp_path / "stdout.txt").write_text("the new run's\n")
    (tmp_path / "proc-9").mkdir()
    restore_earlier(tmp_path, aside)
    assert not aside.exists()
    assert (tmp_path / "stdout.txt").read_text() == "earlier stdout.txt\n"
    assert not (tmp_path / "proc-9").exists() and (tmp_path / "proc-7").is_dir()
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_set_aside_with_nothing_of_nsadiags_sets_nothing_aside(tmp_path):
    (tmp_path / MARKER_NAME).write_text("marked\n")
    (tmp_path / "notes.txt").write_text("mine")
    assert set_aside(tmp_path) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [MARKER_NAME, "notes.txt"]


def test_remove_ours_never_follows_a_link_and_keeps_foreign_entries(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "record.json").write_text("outside")
    run = tmp_path / "run"
    run.mkdir()
    (run / "record.json").write_text("ours")
    os.symlink(outside, run / "trial-0")  # a planted link with one of nsadiag's names
    (run / "keep.txt").write_text("mine")
    # a link is not what nsadiag wrote, whatever its name: kept, and never followed
    assert remove_ours(run) == ["keep.txt", "trial-0"]
    assert (outside / "record.json").read_text() == "outside"
    assert sorted(p.name for p in run.iterdir()) == ["keep.txt", "trial-0"]


def test_drop_left_aside_removes_only_nsadiags_files_of_a_killed_rerun(tmp_path):
    _earlier_run(tmp_path)
    aside = set_aside(tmp_path)
    (aside / "planted.txt").write_text("x")
    assert drop_left_aside(tmp_path) == [aside]
    assert sorted(p.name for p in aside.iterdir()) == ["planted.txt"]


def test_a_trial_directory_is_emptied_of_nsadiags_files_only(tmp_path):
    trial = tmp_path / "trial-3"
    trial.mkdir()
    (trial / "events.jsonl").write_text("{}\n")
    prepare_trial_dir(trial)
    assert trial.is_dir() and list(trial.iterdir()) == []
    (trial / "mine.bin").write_bytes(b"x")
    with pytest.raises(OSError, match="mine.bin"):
        prepare_trial_dir(trial)
    assert (trial / "mine.bin").read_bytes() == b"x"
