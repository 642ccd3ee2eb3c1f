"""--out folders (cli/outfolder.py): files written atomically, a manifest last, never
one run's files beside another's, links replaced rather than followed."""

import hashlib
import json

import pytest

from stepsim.cli.outfolder import MANIFEST, OutFolder, out_folder
from tests.helpers import main_in_process


def test_a_finished_folder_lists_exactly_its_files_with_their_hashes(tmp_path):
    code, _, stderr = main_in_process("run", "tiny-2gpu", "--out", str(tmp_path), "--quiet")
    assert code == 0, stderr
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert manifest["command"] == "run tiny-2gpu" and manifest["complete"] is True
    names = sorted(p.name for p in tmp_path.iterdir() if p.name != MANIFEST)
    assert sorted(manifest["files"]) == names
    for name, entry in manifest["files"].items():
        data = (tmp_path / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_a_new_run_removes_what_the_last_one_wrote_and_keeps_what_it_did_not(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    assert main_in_process("run", "tiny-2gpu", "--out", str(tmp_path), "--quiet")[0] == 0
    args = ("run", "tiny-2gpu", "--out", str(tmp_path), "--trace", "gz", "--quiet")
    assert main_in_process(*args)[0] == 0
    assert not (tmp_path / "trace.json").exists()  # the last run's, gone with it
    assert (tmp_path / "trace.json.gz").exists() and (tmp_path / "notes.txt").read_text() == "mine"


def test_a_folder_stopped_while_written_has_no_manifest_and_none_of_the_old_files(tmp_path):
    with out_folder(tmp_path, "first") as folder:
        folder.text("a.txt", "old a")
        folder.text("b.txt", "old b")
    with pytest.raises(KeyboardInterrupt), out_folder(tmp_path, "second") as folder:
        folder.text("a.txt", "new a")
        raise KeyboardInterrupt  # killed before b.txt and the manifest
    assert not (tmp_path / MANIFEST).exists()  # incomplete, and says so by its absence
    assert (tmp_path / "a.txt").read_text() == "new a" and not (tmp_path / "b.txt").exists()


def test_a_link_in_the_folder_is_replaced_never_followed(tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("precious")
    folder_path = tmp_path / "out"
    folder_path.mkdir()
    (folder_path / "metrics.json").symlink_to(target)
    folder = OutFolder(folder_path, "t")
    folder.begin()
    folder.text("metrics.json", "{}")
    folder.close()
    assert target.read_text() == "precious"
    assert not (folder_path / "metrics.json").is_symlink()
    assert (folder_path / "metrics.json").read_text() == "{}"


def test_a_killed_writers_temporary_files_are_cleared(tmp_path):
    stale = tmp_path / ".metrics.json.stepsim-12345.tmp"
    stale.write_text("half")
    with out_folder(tmp_path, "t") as folder:
        folder.text("metrics.json", "{}")
    assert not stale.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", MANIFEST]


def test_a_damaged_manifest_removes_nothing_but_itself(tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    (tmp_path / MANIFEST).write_text('{"files": {"../../etc/passwd": 1, "keep.txt": 2')
    with out_folder(tmp_path, "t") as folder:
        folder.text("new.txt", "y")
    assert (tmp_path / "keep.txt").exists()
    (tmp_path / MANIFEST).write_text(json.dumps({"files": {"../outside.txt": {}, "/abs": {}}}))
    (tmp_path.parent / "outside.txt").write_text("z")
    with out_folder(tmp_path, "t"):
        pass
    assert (tmp_path.parent / "outside.txt").exists()
