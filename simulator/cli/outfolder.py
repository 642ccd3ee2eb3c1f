"""The folders `--out` names: every file written atomically, a manifest written last,
never one run's files beside another's.

Each file goes to a temporary name in the folder and is renamed over its own name
(``os.replace``): a reader sees the old file or the new one, never half of either, and
a name that was a symbolic link is replaced as a link, so its target is never written.
A folder is begun by removing what the previous manifest listed (and the manifest
itself, and temporary files a killed run left), then filled, then closed by writing
``stepsim-manifest.json``: the command, stepsim's version and every file written with
its size and sha256. A folder without a manifest is incomplete (a run stopped while
writing it) and holds no other run's files; one with a manifest holds exactly what it
lists. Files the manifest does not list (a search's journal, the user's own) are left
alone."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from .. import __version__
from ..scenario import ScenarioError

MANIFEST = "stepsim-manifest.json"
Chunks = Iterable[bytes]  # a file's bytes in pieces (named here: OutFolder has a `bytes`)
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.stepsim-\d+\.tmp$")


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.stepsim-{os.getpid()}.tmp")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """``data`` as ``path``, by a temporary file in its folder renamed over it."""
    tmp = _temporary(path)
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_chunks(path: Path, chunks: Chunks) -> tuple[int, str]:
    """The bytes of ``chunks`` as ``path``, written as they come (never all in memory
    at once), atomically as `atomic_write_bytes`; their size and sha256."""
    tmp = _temporary(path)
    digest, size = hashlib.sha256(), 0
    try:
        with open(tmp, "xb") as f:
            for chunk in chunks:
                f.write(chunk)
                digest.update(chunk)
                size += len(chunk)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return size, digest.hexdigest()


def atomic_write_figure(path: Path, figure: Any, **options: Any) -> None:
    """A matplotlib figure as PNG at ``path``, atomically (`atomic_write_bytes`)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", **options)
    atomic_write_bytes(path, buffer.getvalue())


def figure_png(figure: Any, dpi: float | None = None, **options: Any) -> bytes:
    """``figure.savefig(format="png", dpi=dpi, **options)``'s bytes, drawn once.

    ``savefig`` draws a figure that has a layout engine (constrained layout) twice:
    once without output only to lay it out, then for real, every text measured again
    each time. Here a figure made without pyplot (Figure()) is laid out once, at ``dpi``
    on the Agg canvas that then draws it, and saved without its engine: one draw, the
    same pixels and bytes. Anything else (other options, a GUI canvas) is saved as is."""
    from matplotlib.backend_bases import FigureCanvasBase
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    engine = figure.get_layout_engine()
    plain = type(figure.canvas) in (FigureCanvasBase, FigureCanvasAgg)
    if engine is not None and plain and isinstance(dpi, int | float) and not options:
        from matplotlib import rc_context

        FigureCanvasAgg(figure)  # the canvas savefig would draw on: the layout's renderer
        figure.set_dpi(dpi)
        with suppress(ValueError):  # as Figure.draw ignores it (drawn as laid out before)
            engine.execute(figure)
        # no engine at all (an inactive one, "none", still gets savefig's first draw)
        with rc_context({"figure.autolayout": False, "figure.constrained_layout.use": False}):
            figure.set_layout_engine(None)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, **options)
    return buffer.getvalue()


def _inside(name: object) -> bool:
    """A name of a file inside the folder: plain names joined by '/', none empty, . or
    .. (what a manifest may list; anything else is ignored)."""
    return isinstance(name, str) and all(
        part not in ("", ".", "..") and os.sep not in part for part in name.split("/")
    )


class OutFolder:
    """One command's writes into a folder (module docstring): ``bytes``, ``text`` and
    ``figure`` write a file atomically and record it; ``close`` writes the manifest."""

    def __init__(self, path: Path, command: str) -> None:
        self.path = path
        self.command = command
        self.files: dict[str, dict[str, Any]] = {}

    def begin(self) -> None:
        """Make the folder, and remove the previous manifest, the files it listed and
        the temporary files of a killed run (none of them followed if a link)."""
        self.path.mkdir(parents=True, exist_ok=True)
        manifest = self.path / MANIFEST
        listed: list[str] = []
        if manifest.is_file() and not manifest.is_symlink():
            try:
                old = json.loads(manifest.read_text(encoding="utf-8"))
                listed = [n for n in old.get("files", {}) if _inside(n)]
            except (OSError, ValueError, AttributeError, UnicodeDecodeError):
                listed = []  # a damaged manifest: the files it named cannot be known
        if manifest.exists() or manifest.is_symlink():
            manifest.unlink()
        for name in listed:
            old_file = self.path / name
            if old_file.is_symlink() or old_file.is_file():
                old_file.unlink()
        for entry in self.path.iterdir():
            if _TEMPORARY.match(entry.name) and (entry.is_file() or entry.is_symlink()):
                entry.unlink()

    def _record(self, name: str, data: bytes) -> None:
        self.files[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def _target(self, name: str) -> Path:
        if not _inside(name):
            raise ScenarioError(f"--out: {name!r} is not a file name inside the folder")
        target = self.path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def bytes(self, name: str, data: bytes) -> None:
        atomic_write_bytes(self._target(name), data)
        self._record(name, data)

    def stream(self, name: str, chunks: Chunks) -> None:
        """A file written piece by piece as ``chunks`` makes them (a large trace),
        recorded as `bytes` records one."""
        size, sha256 = atomic_write_chunks(self._target(name), chunks)
        self.files[name] = {"bytes": size, "sha256": sha256}

    def text(self, name: str, text: str) -> None:
        self.bytes(name, text.encode("utf-8"))

    def figure(self, name: str, figure: Any, **options: Any) -> None:
        """A matplotlib figure as PNG (`figure_png`, into memory first)."""
        self.bytes(name, figure_png(figure, **options))  # as atomic_write_figure, and recorded

    def close(self) -> None:
        """The manifest, last: the folder is complete."""
        document = {
            "stepsim": __version__,
            "command": self.command,
            "complete": True,
            "files": self.files,
        }
        atomic_write_bytes(
            self.path / MANIFEST, (json.dumps(document, indent=2) + "\n").encode("utf-8")
        )


@contextmanager
def out_folder(path: Path, command: str) -> Iterator[OutFolder]:
    """An OutFolder begun; its manifest written only if the block ends normally."""
    folder = OutFolder(path, command)
    folder.begin()
    yield folder
    folder.close()
