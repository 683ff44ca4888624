"""Writing reports and profiles: inside the requested folder, atomically, with clear errors.

* ``output_folder(path)`` creates the folder (and parents) and checks it is writable.
* ``inside(folder, name)`` is ``folder / name`` for a plain file name; a name with a folder
  part or ``..`` is refused, so nothing is written outside the requested folder.
* ``write_bytes``/``write_text`` write a temporary file in the target's folder and rename it
  over the target (``os.replace``): a reader never sees half a file, an existing file is
  replaced whole, and a symbolic link at the target is replaced, not followed (nothing is
  written where it points).

Every failure is an ``OutputPathError`` naming the path, the reason and what to do.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from outcore.errors import OutputPathError

_WHAT_TO_DO = "Choose a folder you can write to (e.g. --out ./out)."


def output_folder(path: str | Path) -> Path:
    """``path`` as a folder that exists and is writable (created with its parents)."""
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"cannot create the output folder {str(folder)!r}: "
                              f"{exc.strerror or exc}. {_WHAT_TO_DO}") from None
    if not folder.is_dir():
        raise OutputPathError(f"{str(folder)!r} is not a folder. {_WHAT_TO_DO}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(f"the output folder {str(folder)!r} is not writable. "
                              f"{_WHAT_TO_DO}")
    return folder


def check_folder(path: str | Path) -> Path:
    """``path`` if it is, or could be created as, a writable folder; creates nothing (so a
    command can check ``--out`` before its capture)."""
    folder = Path(path)
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise OutputPathError(f"cannot create the output folder {str(folder)!r}: "
                              f"{str(probe)!r} is a file. {_WHAT_TO_DO}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OutputPathError(f"the output folder {str(folder)!r} cannot be written "
                              f"({str(probe)!r} is not writable). {_WHAT_TO_DO}")
    return folder


def inside(folder: str | Path, name: str) -> Path:
    """``folder / name`` where ``name`` is a plain file name (no folder part, no "..")."""
    if not name or name in (".", "..") or Path(name).name != name or "/" in name \
            or "\\" in name:
        raise OutputPathError(f"{name!r} is not a plain file name; outcore writes only inside "
                              f"{str(folder)!r}")
    return Path(folder) / name


def check_writable(path: str | Path) -> Path:
    """``path`` whose folder exists (created) and is writable; the file is not touched."""
    target = Path(path)
    if target.is_dir():
        raise OutputPathError(f"{str(target)!r} is a folder; give a file name. {_WHAT_TO_DO}")
    output_folder(target.parent if str(target.parent) else ".")
    return target


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temporary file in its folder, then a rename)."""
    target = check_writable(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise OutputPathError(f"cannot write {str(target)!r}: {exc.strerror or exc}. "
                              f"{_WHAT_TO_DO}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give what open() would
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise OutputPathError(f"cannot write {str(target)!r}: {exc.strerror or exc}. "
                              f"{_WHAT_TO_DO}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _umask() -> int:
    current = os.umask(0o022)
    os.umask(current)
    return current


def write_text(path: str | Path, text: str) -> Path:
    """``write_bytes`` of ``text`` in UTF-8."""
    return write_bytes(path, text.encode("utf-8"))
