"""The backend's on-disk cache: generated modules and GPU selection results.

The directory is ``$VERIMIRAGE_CACHE_DIR`` if set, else
``$XDG_CACHE_HOME/verimirage`` (``~/.cache/verimirage``). Never the working
directory. Every write is atomic (a temporary file in the same directory, then
``os.replace``), so concurrent processes never see half-written entries; an
entry that cannot be read back (truncated, not JSON, wrong format) is
discarded with a warning and treated as a miss.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: Format version of cache entries; entries of another version are misses.
ENTRY_FORMAT = 1

#: The largest entry file :meth:`DiskCache.get` reads (64 MiB; the largest search entry seen is 0.33 MB): a larger one
#: is a corrupt entry, never parsed (its JSON would take the caller's memory and time without a bound)
MAX_ENTRY_BYTES = 1 << 26


def cache_dir() -> Path:
    """The cache directory (created if missing)."""
    env = os.environ.get("VERIMIRAGE_CACHE_DIR")
    if env:
        d = Path(env).expanduser()
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        d = Path(base) / "verimirage"
    d.mkdir(parents=True, exist_ok=True)
    return d


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same directory + ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def key_of(parts: dict[str, Any]) -> str:
    """A stable SHA-256 key of a JSON-able dict (sorted keys)."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class DiskCache:
    """A JSON key-value store, one file per key, under ``cache_dir()/name``."""

    def __init__(self, name: str, root: Path | None = None) -> None:
        self.dir = (Path(root) if root is not None else cache_dir()) / name
        self.dir.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        """File of entry ``key``."""
        if not key or not all(c in "0123456789abcdef" for c in key):
            raise ValueError(f"cache key {key!r}; expected a hex digest (use key_of)")
        return self.dir / f"{key}.json"

    def get(self, key: str) -> Any | None:
        """The value stored under ``key``, or None (a corrupt entry, one over :data:`MAX_ENTRY_BYTES` included, is
        removed with a warning: never read further, never an exception)."""
        p = self.path(key)
        try:
            with open(p, "rb") as f:
                raw = f.read(MAX_ENTRY_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as e:
            log.warning("cache entry %s unreadable (%s); ignoring it", p, e)
            return None
        try:
            if len(raw) > MAX_ENTRY_BYTES:
                raise ValueError(f"larger than {MAX_ENTRY_BYTES} bytes, the most an entry may hold; not read further")
            entry = json.loads(raw.decode())
            if not isinstance(entry, dict) or entry.get("format") != ENTRY_FORMAT or entry.get("key") != key:
                raise ValueError("not an entry of this format")
            return entry["value"]
        except (ValueError, KeyError, RecursionError) as e:  # (not UTF-8 is a ValueError; nesting too deep)
            log.warning("cache entry %s is corrupt (%s); discarding it", p, e)
            with contextlib.suppress(OSError):
                p.unlink()
            return None

    def put(self, key: str, value: Any) -> None:
        """Store ``value`` (JSON-able) under ``key`` atomically."""
        atomic_write(self.path(key), json.dumps({"format": ENTRY_FORMAT, "key": key, "value": value}, indent=1))
