#!/usr/bin/env python3
"""Reads a `kvc-run restore --dump-kv` file without numpy or torch.

  kv-dump.py FILE                   prints its request and shape
  kv-dump.py FILE --against OTHER --max-error X
                                    and the largest |FILE - OTHER| relative
                                    to the largest |OTHER|, failing above X

Exits 1 on a malformed file, other tensors, another request or a
reference of zeros.
"""
import argparse
import json
import struct
import sys


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    (size,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8:8 + size])
    header.pop("__metadata__", None)
    tensors = {}
    for name, info in header.items():
        if info["dtype"] != "F32":
            sys.exit(f"{path}: {name} is {info['dtype']}, not F32")
        begin, end = info["data_offsets"]
        count = (end - begin) // 4
        tensors[name] = (info["shape"], struct.unpack_from(
            f"<{count}f", data, 8 + size + begin))
    return tensors


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("file")
    parser.add_argument("--against")
    parser.add_argument("--max-error", type=float, default=0.0)
    args = parser.parse_args()
    dump = load(args.file)
    layers = sum(1 for name in dump if name.endswith(".key"))
    shape = dump["layers.0.key"][0]
    print(f"tokens {len(dump['tokens'][1])}, layers {layers}, "
          f"kv heads {shape[1]}, head dim {shape[2]}")
    if not args.against:
        return 0
    other = load(args.against)
    if sorted(dump) != sorted(other) or dump["tokens"] != other["tokens"]:
        sys.exit("the dumps hold other tensors or another request")
    error = largest = 0.0
    for name, (_, values) in other.items():
        if name == "tokens":
            continue
        mine = dump[name][1]
        error = max(error, max(abs(a - b) for a, b in zip(mine, values)))
        largest = max(largest, max(abs(b) for b in values))
    if largest == 0:
        sys.exit(f"{args.against}: every K and V value is zero")
    relative = error / largest
    verdict = "ok" if relative <= args.max_error else "FAILED"
    print(f"max error {relative:.3g} (bound {args.max_error:g}): {verdict}")
    return 0 if verdict == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
