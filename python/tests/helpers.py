"""Helpers shared by kvc's Python tests."""

from __future__ import annotations

from pathlib import Path


def corrupt_one_object(store: Path) -> Path:
    """Flips 16 bytes in the middle of one stored object of a file:// store
    (not a layout record); returns its path."""
    objects = sorted(p for p in store.rglob("*")
                     if p.is_file() and "layouts" not in p.parts)
    victim = objects[len(objects) // 2]
    data = bytearray(victim.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 16):
        data[i] ^= 0xFF
    victim.write_bytes(bytes(data))
    return victim
