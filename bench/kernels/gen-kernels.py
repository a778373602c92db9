#!/usr/bin/env python3
"""Prints a module of kvc.kernels of every generated kind at the chunk sizes
the kernel benchmark measures: a restore and a save kernel per codec
composition the planner can choose, and the hidden-state projection's
epilogue.

  python3 bench/kernels/gen-kernels.py > /tmp/kernels.mlir
  kvc-opt /tmp/kernels.mlir \
      --kvc-import-model=examples/models/llama-3.1-8b/config.json \
      --kvc-lower-kernels --kvc-kernels-to-ptx \
      --kvc-emit-bundle=file=kernels.json -o /dev/null

With --shapes TxL,... it makes those chunk shapes instead; with --restores
only what a restore plan over such chunks launches (the restore kernels and
the projection's), and --save-shapes TxL,... makes the save kernels at
those shapes instead (the executor's tests of generated kernels take
restores at the plans' chunk shapes and saves at the store's objects').
--saves makes only the save kernels, and --codecs REGEX only the
compositions whose codec ("none" when raw) REGEX matches: with
kvc-lower-kernels' options, variants of a few kernels.
"""
import argparse
import re
import sys

# (codec, storage): the compositions kvc-select-codec chooses among, each
# decompressed on the host first (no lossless stage on the device).
CODECS = [
    (None, "bf16"),
    ("transform = hadamard", "bf16"),
    ("quant = int8", "bf16"),
    ("quant = int4", "bf16"),
    ("quant = int2", "bf16"),
    ("transform = hadamard, quant = int8", "bf16"),
    ("transform = hadamard, quant = int4", "bf16"),
    ("transform = hadamard, quant = int2", "bf16"),
    ("quant = int4, key_axis = token, value_axis = token, group = 64", "bf16"),
    ("quant = fp8", "bf16"),
    ("transform = hadamard, quant = fp8", "bf16"),
]
# Codecs whose saves encode on the host (their registry row has no device
# encode): restore kernels only.
HOST_ENCODED = {"quant = fp8", "transform = hadamard, quant = fp8"}
# (tokens, layers): launch-bound small chunks and bandwidth-bound large ones.
SHAPES = [(16, 1), (256, 32), (1024, 32)]


def chunk(codec, storage, tokens, layers):
    c = f", codec <{codec}>" if codec else ""
    return (f"!kvc.chunk<kv x {storage}, tokens 0 to {tokens}, "
            f"layers 0 to {layers}, device{c}>")


def main(out, shapes, save_shapes, codecs):
    for i, (codec, storage) in enumerate(CODECS):
        if not re.search(codecs, codec or "none"):
            continue
        for tokens, layers in shapes:
            src = chunk(codec, storage, tokens, layers)
            dst = chunk(None, storage, tokens, layers)
            out.write(f"func.func @k{i}_{tokens}_{layers}(%c: {src}) {{\n")
            out.write(f'  kvc.kernel "restore"(%c) : ({src}) -> () {{\n')
            out.write(f"  ^bb0(%in: {src}):\n")
            value = "%in"
            if codec and "quant" in codec:
                rest = ", ".join(p for p in codec.split(", ")
                                 if p.startswith("transform"))
                mid = chunk(rest or None, storage, tokens, layers)
                out.write(f"    %d = kvc.dequant %in : {src} -> {mid}\n")
                value, src = "%d", mid
            if codec and "hadamard" in codec:
                out.write(f"    %u = kvc.untransform {value} : {src} -> {dst}\n")
                value = "%u"
            out.write(f"    kvc.scatter {value} : {dst}\n")
            out.write("  }\n  return\n}\n")
    for tokens, layers in shapes if re.search(codecs, "none") else []:
        hidden = (f"!kvc.chunk<hidden x bf16, tokens 0 to {tokens}, "
                  f"layers 0 to {layers}, device>")
        kv = chunk(None, "bf16", tokens, layers)
        out.write(f"func.func @p_{tokens}_{layers}(%h: {hidden}) {{\n")
        out.write(f'  kvc.kernel "project_scatter"(%h) : ({hidden}) -> () {{\n')
        out.write(f"  ^bb0(%in: {hidden}):\n")
        out.write(f"    %p = kvc.project %in : {hidden} -> {kv}\n")
        out.write(f"    kvc.scatter %p : {kv}\n")
        out.write("  }\n  return\n}\n")
    for i, (codec, storage) in enumerate(CODECS):
        if not re.search(codecs, codec or "none") or codec in HOST_ENCODED:
            continue
        for tokens, layers in save_shapes:
            # gather [transform] [quant], yielding the encoded chunk.
            out_type = chunk(codec, storage, tokens, layers)
            value_type = chunk(None, storage, tokens, layers)
            out.write(f"func.func @s{i}_{tokens}_{layers}() -> {out_type} {{\n")
            out.write(f'  %r = kvc.kernel "save"() : () -> {out_type} {{\n')
            out.write(f"    %g = kvc.gather : {value_type}\n")
            value = "%g"
            if codec and "hadamard" in codec:
                rotated = chunk("transform = hadamard", storage, tokens, layers)
                out.write(f"    %t = kvc.transform %g : {value_type} -> {rotated}\n")
                value, value_type = "%t", rotated
            if codec and "quant" in codec:
                out.write(f"    %q = kvc.quant {value} : {value_type} -> {out_type}\n")
                value = "%q"
            out.write(f"    kvc.yield {value} : {out_type}\n")
            out.write(f"  }}\n  return %r : {out_type}\n}}\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", help="chunk shapes TOKENSxLAYERS,...")
    parser.add_argument("--restores", action="store_true")
    parser.add_argument("--save-shapes", help="save kernels' shapes TxL,...")
    parser.add_argument("--saves", action="store_true",
                        help="only the save kernels")
    parser.add_argument("--codecs", default="",
                        help="only the compositions whose codec matches")
    args = parser.parse_args()

    def parse(text):
        return [tuple(int(n) for n in s.split("x")) for s in text.split(",")]

    shapes = parse(args.shapes) if args.shapes else SHAPES
    if args.save_shapes:
        save_shapes = parse(args.save_shapes)
    else:
        save_shapes = [] if args.restores else shapes
    main(sys.stdout, [] if args.saves else shapes, save_shapes, args.codecs)
