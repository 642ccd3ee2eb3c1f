"""A file written piece by piece into an --out folder (OutFolder.stream, the trace's
way): recorded as one written whole would be, and nothing left if its making fails."""

import hashlib
import json

import pytest

from stepsim.cli.outfolder import MANIFEST, out_folder


def test_a_streamed_file_is_recorded_as_a_whole_one(tmp_path):
    pieces = [b"{", b"", b'"a":1', b"}" * 3]
    with out_folder(tmp_path, "streamed") as folder:
        folder.stream("s.json", iter(pieces))
        folder.bytes("b.json", b"".join(pieces))
    files = json.loads((tmp_path / MANIFEST).read_text())["files"]
    data = b"".join(pieces)
    assert (tmp_path / "s.json").read_bytes() == data
    expected = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert files["s.json"] == files["b.json"] == expected


def test_a_stream_that_fails_leaves_neither_the_file_nor_a_temporary(tmp_path):
    def pieces():
        yield b"half of it"
        raise RuntimeError("stopped")

    (tmp_path / "s.json").write_bytes(b"the old one")
    with pytest.raises(RuntimeError), out_folder(tmp_path, "streamed") as folder:
        folder.stream("s.json", pieces())
    assert (tmp_path / "s.json").read_bytes() == b"the old one"  # replaced only whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]  # no temporary, no manifest
