"""Output files written all or none, and checked before the work that fills them.

A command that writes several files after a long run (``dynoplan simulate --out DIR``: five; ``dynoplan replay``:
``--report-json`` and ``--per-request``) must not leave half of them new and half from an earlier run, nor lose
an earlier run's file to a write that fails halfway (a full disk). :func:`write_together` writes each output to a
hidden ``.NAME.partial`` beside it and renames them all into place only once every one is written;
:func:`writable_file_problem` is the check made before the run (the directory takes a new file; the path is not a
directory). Both give one line naming the path (the caller adds its flag).

An output that exists and is neither a regular file nor a directory (``/dev/stdout``, ``/dev/null``, a FIFO) is a
stream: it is written in place (a rename would replace the device node), after the hidden files and before any
rename, so its failure too leaves every file as it was. A symbolic link is followed: its target is replaced and
the link kept, as a write through it would; an existing file's permission bits are kept.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


def _is_stream(path: Path) -> bool:
    """True when ``path`` exists and is neither a regular file nor a directory (a device, a FIFO, a socket)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def writable_file_problem(path: str) -> str | None:
    """Why ``path`` cannot take an output file, or None when it can: checked before the work that produces it.

    Problems: an existing directory (``is a directory``); a stream (:func:`_is_stream`) the process may not write;
    a directory (the one the path, or its link, resolves into) where no new file can be created -- tried with a
    temporary file, removed at once, as a rename into place needs. A missing parent directory is the caller's
    check (its own message). A path ending in ``/`` names a directory, existing or not (``Path`` would drop the
    slash and write a file of that name). A stream is recognised on the path itself (``stat`` follows links):
    ``/dev/stdout`` on a pipe resolves to ``/proc/PID/fd/pipe:[N]``, a name that exists nowhere, yet opens."""
    if path.endswith(("/", os.sep)):
        return "ends in '/' (a directory), expected a file path"
    if _is_stream(Path(path)):
        return None if os.access(path, os.W_OK) else "not writable, expected a writable file"
    p = Path(os.path.realpath(path))
    if p.is_dir():
        return "is a directory, expected a file path"
    try:
        with tempfile.TemporaryFile(dir=p.parent):
            pass
    except OSError as e:
        return f"cannot create a file in {p.parent}: {e.strerror or e}, expected a writable directory"
    return None


@contextmanager
def naming(path: Path) -> Iterator[Path]:
    """Yield ``path``; an OSError raised inside (closing the file included) that names no file, or names the
    hidden ``.partial`` file being written for it, gets ``path`` as its ``filename``, so the caller's message says
    which output failed."""
    try:
        yield path
    except OSError as e:
        if e.filename is None or str(e.filename).endswith(".partial"):
            e.filename = str(path)
            e.filename2 = None
        raise


def write_together(outputs: Sequence[tuple[str | Path, Callable[[Path], object]]]) -> None:
    """Write every ``(path, write)`` output, all or none (module docstring): ``write(p)`` writes the whole output
    to the path ``p`` it is given (the hidden ``.NAME.partial`` beside ``path``, or ``path`` itself for a stream),
    creating or truncating it. The hidden files are written first, then the streams, then each hidden file is
    renamed onto its path; none is renamed unless every write succeeded (an output that became a directory
    meanwhile is refused before any rename), and the hidden files are removed whatever happens.

    Raises OSError (the first failure); its ``filename`` is the output's ``path`` (also when the failing call was
    a write, which names none: a full disk)."""
    plan: list[tuple[Path, Path, Path | None, Callable[[Path], object]]] = []
    for path, write in outputs:
        final = Path(path)
        if _is_stream(final):  # written in place, through the path given (/dev/stdout on a pipe: see above)
            plan.append((final, final, None, write))
            continue
        real = Path(os.path.realpath(final)) if final.is_symlink() else final
        plan.append((final, real, real.with_name(f".{real.name}.partial"), write))
    try:
        for final, _, part, write in plan:
            if part is not None:
                with naming(final):
                    write(part)
        for final, real, part, write in plan:
            if part is None:
                with naming(final):
                    write(real)
        for final, real, part, _ in plan:  # a rename onto a directory is the one way left to fail: before any
            if part is not None and real.is_dir():
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(final))
        for final, real, part, _ in plan:
            if part is None:
                continue
            with naming(final):
                if real.is_file():
                    os.chmod(part, stat.S_IMODE(real.stat().st_mode))
                os.replace(part, real)
    finally:
        for _, _, part, _ in plan:
            if part is not None:
                part.unlink(missing_ok=True)


def write_flagged_outputs(
    command: str, outputs: Sequence[tuple[str, str, Callable[[Path], object]]], fallback_text: str
) -> int:
    """:func:`write_together` for a command's ``(flag, path, write)`` outputs, the exit status as the result: 0 when
    every output was written; when one cannot be, 2, after ``fallback_text`` (the command's report, so the computed
    result is not lost) on stdout and one line on stderr naming ``command``, the flag and the path of the output
    that failed (every output is then as it was: :func:`write_together`)."""
    import sys

    try:
        write_together([(path, write) for _, path, write in outputs])
    except OSError as e:
        flag, path = next(((f, p) for f, p, _ in outputs if str(Path(p)) == e.filename), outputs[0][:2])
        sys.stdout.write(fallback_text)
        sys.stdout.flush()
        print(
            f"dynoplan {command}: error: cannot write {flag} {path}: {e.strerror or e} (report printed to stdout; "
            "no output replaced)",
            file=sys.stderr,
        )
        return 2
    return 0
