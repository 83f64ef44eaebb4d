"""The code bundle, packed exactly as `gpux_jobs::bundle` packs it
(docs/jobs.md "The code bundle"): the same files left out (`.git`, caches,
virtual environments, `*.pyc`, what `.gpuxignore` names), symbolic links
refused, entries in name order with no times, owners or umask, a ustar tar
written as the Rust `tar` crate writes it, compressed with zlib at level 6
into a gzip stream with the Rust `flate2` crate's header. So the same
directory gives the same bytes, and the same SHA-256 name, from the CLI and
from Python (clients/python/tests/test_bundle.py holds the two together).

The deflate stream is zlib's: a Python whose zlib module is built on stock
zlib (CPython's wheels, Debian, Ubuntu, macOS' python.org builds) gives the
CLI's bytes; one built on zlib-ng (Fedora 40 and later) gives another,
equally valid bundle with another name.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

UNPACKED_BYTES_MAX = 256 << 20
FILES_MAX = 50_000
INPUT_BYTES_MAX = 1 << 30
EXCLUDED_ALWAYS = (".git", "__pycache__", ".venv", "venv", ".ipynb_checkpoints", "node_modules", ".mypy_cache", ".pytest_cache")
IGNORE_FILE = ".gpuxignore"
BLOCK = 512


class BundleError(ValueError):
    """The directory cannot be packed (the CLI's `BundleError`, same cases)."""


class _Ignore:
    """What is left out: names at any depth, suffixes of files, directories."""

    def __init__(self, names: list, suffixes: list, directories: list):
        self.names, self.suffixes, self.directories = names, suffixes, directories

    @classmethod
    def load(cls, root: Path) -> "_Ignore":
        ignore = cls(list(EXCLUDED_ALWAYS), [".pyc"], [])
        path = root / IGNORE_FILE
        if path.is_file():
            for line in path.read_text().splitlines():
                line = line.split("#", 1)[0].strip()
                if not line:
                    continue
                if line.startswith("*"):
                    ignore.suffixes.append(line[1:])
                elif line.endswith("/"):
                    ignore.directories.append(line[:-1])
                else:
                    ignore.names.append(line)
        return ignore

    def skips(self, name: str, is_dir: bool) -> bool:
        return (
            name in self.names
            or (is_dir and name in self.directories)
            or (not is_dir and any(name.endswith(suffix) for suffix in self.suffixes))
        )


def _files(root: Path, ignore: _Ignore, bytes_max: int) -> list:
    """(relative path, full path, executable) of the files to pack, sorted
    by their relative path's bytes, as the CLI sorts them."""
    found = []
    total = 0
    pending = [("", root)]
    while pending:
        prefix, directory = pending.pop()
        entries = sorted(os.scandir(directory), key=lambda e: os.fsencode(e.name), reverse=True)
        for entry in entries:
            is_link = entry.is_symlink()
            is_dir = entry.is_dir(follow_symlinks=False)
            if ignore.skips(entry.name, is_dir):
                continue
            relative = entry.name if not prefix else f"{prefix}/{entry.name}"
            if is_link:
                raise BundleError(
                    f"{entry.path} is a symbolic link: bundles hold files and directories only "
                    "(copy what it points to, or list it in .gpuxignore)"
                )
            if is_dir:
                pending.append((relative, Path(entry.path)))
                continue
            info = entry.stat(follow_symlinks=False)
            total += info.st_size
            if total > bytes_max:
                raise BundleError(f"over {bytes_max >> 20} MiB of files: pass data as inputs, or list large files in .gpuxignore")
            found.append((relative, Path(entry.path), bool(info.st_mode & 0o111)))
            if len(found) > FILES_MAX:
                raise BundleError(f"over {FILES_MAX} files")
    found.sort(key=lambda f: os.fsencode(f[0]))
    return found


def _octal(value: int, width: int) -> bytes:
    """The `tar` crate's octal field: zero-padded digits, then a NUL."""
    digits = format(value, "o").encode()
    return digits.rjust(width - 1, b"0")[-(width - 1):] + b"\0"


def _header(name: bytes, prefix: bytes, size: int, mode: int, typeflag: bytes, gnu: bool) -> bytes:
    header = bytearray(BLOCK)
    header[0 : len(name)] = name
    header[100:108] = _octal(mode, 8)
    header[108:116] = _octal(0, 8)
    header[116:124] = _octal(0, 8)
    header[124:136] = _octal(size, 12)
    header[136:148] = _octal(0, 12)
    header[156:157] = typeflag
    header[257:265] = b"ustar  \0" if gnu else b"ustar\x0000"
    header[345 : 345 + len(prefix)] = prefix
    header[148:156] = b" " * 8
    header[148:156] = _octal(sum(header), 8)
    return bytes(header)


def _split(path: bytes):
    """The `tar` crate's ustar name: `(name, prefix)` with the whole path as
    the name when it fits in 100 bytes, or split after the longest parent
    directory that fits in the 155 bytes of the prefix. When the rest is
    still over 100 bytes the name is None, and the prefix stays as the
    crate leaves it: written before the name was found too long."""
    if len(path) <= 100:
        return path, b""
    parts = path.split(b"/")
    for cut in range(len(parts) - 1, 0, -1):
        prefix = b"/".join(parts[:cut])
        if len(prefix) <= 155:
            name = b"/".join(parts[cut:])
            return (name if len(name) <= 100 else None), prefix
    return None, b""


def _pad(length: int) -> bytes:
    return b"\0" * (-length % BLOCK)


def _entry(relative: str, data: bytes, executable: bool) -> bytes:
    path = relative.encode()
    mode = 0o755 if executable else 0o644
    name, prefix = _split(path)
    out = b""
    if name is None:
        # GNU's long name: an `L` entry holding the path, then the entry
        # with the path's first 100 bytes, as the `tar` crate writes it.
        out += _header(b"././@LongLink", b"", len(path) + 1, 0o644, b"L", gnu=True)
        out += path + b"\0" + _pad(len(path) + 1)
        name = path[:100].decode("utf-8", "ignore").encode()
    out += _header(name, prefix, len(data), mode, b"0", gnu=False)
    return out + data + _pad(len(data))


def pack(directory: str | Path, bytes_max: int = UNPACKED_BYTES_MAX) -> bytes:
    """The bundle of `directory`: the bytes the CLI packs for it."""
    root = Path(directory)
    if not root.is_dir():
        raise BundleError(f"{root} is not a directory")
    files = _files(root, _Ignore.load(root), bytes_max)
    tar = bytearray()
    for relative, full, executable in files:
        tar += _entry(relative, full.read_bytes(), executable)
    tar += b"\0" * 1024
    compressor = zlib.compressobj(6, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY)
    deflated = compressor.compress(bytes(tar)) + compressor.flush()
    header = b"\x1f\x8b\x08\x00" + struct.pack("<I", 0) + b"\x00\xff"
    trailer = struct.pack("<II", zlib.crc32(tar) & 0xFFFFFFFF, len(tar) & 0xFFFFFFFF)
    return header + deflated + trailer


def pack_input(directory: str | Path) -> bytes:
    """An input directory packed for the job store (up to 1 GiB of files)."""
    return pack(directory, INPUT_BYTES_MAX)


__all__ = ["BundleError", "pack", "pack_input"]
