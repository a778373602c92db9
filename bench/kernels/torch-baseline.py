#!/usr/bin/env python3
"""The generated kernels' operations written in PyTorch, eager and
torch.compile (Triton), timed with CUDA events beside a device-to-device copy
of the same bytes: the baseline docs/results.md compares kvc's generated
kernels with. Same chunk shapes as bench/kernels/gen-kernels.py (Llama-3-8B
KV: 8 heads x 128, 32 layers), the same stored layout's bytes (packed
values low bits first, f16 scale and minimum per group; K per channel in
groups of 32 tokens, V per token in groups of 32 channels), the same paged
cache (16-token blocks through a shuffled block table). The projection's
epilogue ("rope_scatter") reads f32 K and V and a cos/sin table row per
position, rotates K's head halves as vLLM's rotary_embedding does, rounds to
bf16 and scatters. The save side gathers the chunk's rows and encodes them
in the same layout (raw: a gather); the projection's prologue is Hugging
Face's LlamaRMSNorm over hidden 4096.

  python3 bench/kernels/torch-baseline.py [--tokens 256 1024]
"""
import argparse
import functools

import torch

WIDTH, HEAD, LAYERS, BLOCK, GROUP, HIDDEN = 1024, 128, 32, 16, 32, 4096


def unpack(packed, bits):
    # packed: [..., n * bits / 8] uint8 -> [..., n] float32, low bits first.
    per = 8 // bits
    shifts = torch.arange(0, 8, bits, device=packed.device, dtype=torch.uint8)
    q = (packed.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return q.flatten(-2).float()


def hadamard(x):
    n = x.shape[-1]
    h = x.reshape(-1, n)
    length = 1
    while length < n:
        h = h.reshape(-1, n // (2 * length), 2, length)
        a, b = h[:, :, 0], h[:, :, 1]
        h = torch.stack((a + b, a - b), dim=2)
        length *= 2
    return (h.reshape(x.shape) * n ** -0.5)


def restore(kq, kparams, vq, vparams, slots, kcache, vcache, bits, had):
    # kq, vq: [L, T, WIDTH*bits/8]; kparams: [L, T/GROUP, WIDTH, 2] f16;
    # vparams: [L, T, WIDTH/GROUP, 2] f16; slots: [T] rows of the cache.
    L, T = kq.shape[0], kq.shape[1]
    k = unpack(kq, bits)  # [L, T, WIDTH]
    ks = kparams.float().repeat_interleave(GROUP, dim=1)[:, :T]
    k = ks[..., 1] + ks[..., 0] * k
    v = unpack(vq, bits).reshape(L, T, WIDTH // GROUP, GROUP)
    vp = vparams.float()
    v = (vp[..., 1:2] + vp[..., 0:1] * v).reshape(L, T, WIDTH)
    if had:
        k = hadamard(k.reshape(L, T, -1, HEAD)).reshape(L, T, WIDTH)
        v = hadamard(v.reshape(L, T, -1, HEAD)).reshape(L, T, WIDTH)
    kcache[:, slots] = k.to(torch.bfloat16)
    vcache[:, slots] = v.to(torch.bfloat16)


def restore_raw(k, v, slots, kcache, vcache):
    kcache[:, slots] = k
    vcache[:, slots] = v


def rope_scatter(k, v, cos_sin, slots, kcache, vcache):
    # k, v: [L, T, WIDTH] f32; cos_sin: [T, HEAD] f32 (cosines, then sines).
    L, T = k.shape[0], k.shape[1]
    cos, sin = cos_sin[:, :HEAD // 2], cos_sin[:, HEAD // 2:]
    cos, sin = cos[None, :, None], sin[None, :, None]
    x = k.reshape(L, T, -1, HEAD)
    a, b = x[..., :HEAD // 2], x[..., HEAD // 2:]
    k = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    kcache[:, slots] = k.reshape(L, T, WIDTH).to(torch.bfloat16)
    vcache[:, slots] = v.to(torch.bfloat16)


def pack(q, bits):
    # q: [..., n] uint8 -> [..., n * bits / 8], low bits first.
    per = 8 // bits
    shifts = torch.arange(0, 8, bits, device=q.device, dtype=torch.int32)
    q = q.reshape(*q.shape[:-1], q.shape[-1] // per, per).to(torch.int32)
    return (q << shifts).sum(-1).to(torch.uint8)


def quantize(x, dim, bits):
    # Asymmetric quantization over `dim`: f16 scale and minimum per group,
    # the values against the rounded parameters (kvc's encoder).
    levels = (1 << bits) - 1
    low = x.amin(dim, keepdim=True).half()
    scale = ((x.amax(dim, keepdim=True) - low.float()) / levels)
    scale = scale.clamp_min(6.1e-5).half()
    q = ((x - low.float()) * (1 / scale.float())).clamp(0, levels).round()
    return q.to(torch.uint8), torch.cat((scale, low), dim)


def save(kcache, vcache, slots, bits, had):
    # Gathers the chunk's rows and encodes them as kvc stores them: K per
    # channel in groups of GROUP tokens, V per token in groups of GROUP
    # channels, optionally rotated first.
    k, v = kcache[:, slots].float(), vcache[:, slots].float()
    L, T = k.shape[0], k.shape[1]
    if had:
        k = hadamard(k.reshape(L, T, -1, HEAD)).reshape(L, T, WIDTH)
        v = hadamard(v.reshape(L, T, -1, HEAD)).reshape(L, T, WIDTH)
    kq, kparams = quantize(k.reshape(L, T // GROUP, GROUP, WIDTH), 2, bits)
    vq, vparams = quantize(v.reshape(L, T, WIDTH // GROUP, GROUP), 3, bits)
    return (pack(kq.reshape(L, T, WIDTH), bits), kparams,
            pack(vq.reshape(L, T, WIDTH), bits), vparams)


def save_raw(kcache, vcache, slots):
    return kcache[:, slots], vcache[:, slots]


def rms_norm(x, weight, eps):
    # x: [L, T, HIDDEN] bf16; weight: [L, HIDDEN] f32 -> bf16, as Hugging
    # Face's LlamaRMSNorm computes it.
    x = x.float()
    scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return (x * scale * weight[:, None]).to(torch.bfloat16)


def time_us(fn, iters=200):
    for _ in range(5):
        fn()
    start, stop = torch.cuda.Event(True), torch.cuda.Event(True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return 1000 * start.elapsed_time(stop) / iters


def main():
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 512
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[256, 1024])
    args = parser.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'operation':<28} {'tokens':>6} {'MB':>8} {'eager us':>9} "
          f"{'compiled us':>11} {'copy us':>8} {'eager %':>8} {'comp %':>7}")
    compiled_raw = torch.compile(restore_raw, fullgraph=True, dynamic=False)
    compiled_rope = torch.compile(rope_scatter, fullgraph=True, dynamic=False)
    compiled_save_raw = torch.compile(save_raw, fullgraph=True, dynamic=False)
    compiled_norm = torch.compile(rms_norm, fullgraph=True, dynamic=False)
    for T in args.tokens:
        blocks = T // BLOCK + 1
        table = torch.randperm(2 * blocks, device=dev)[:blocks]
        pos = torch.arange(T, device=dev)
        slots = table[pos // BLOCK] * BLOCK + pos % BLOCK
        rows = 2 * blocks * BLOCK
        kcache = torch.empty(LAYERS, rows, WIDTH, dtype=torch.bfloat16,
                             device=dev)
        vcache = torch.empty_like(kcache)
        cases = [("raw bf16", None, False)] + [
            (f"{'hadamard+' if had else ''}int{bits}", bits, had)
            for had in (False, True) for bits in (8, 4, 2)] + [
            ("rope_scatter", "rope", False), ("save raw bf16", "save", False)
        ] + [(f"save {'hadamard+' if had else ''}int{bits}", "save", (bits, had))
             for had in (False, True) for bits in (8, 4, 2)] + [
            ("rms_norm", "norm", False)]
        for name, bits, had in cases:
            written = 2 * LAYERS * T * WIDTH * 2
            if bits == "norm":
                x = torch.randn(LAYERS, T, HIDDEN, device=dev).bfloat16()
                weight = torch.rand(LAYERS, HIDDEN, device=dev) + 0.5
                inputs = (x, weight, 1e-5)
                read = x.numel() * 2 + weight.numel() * 4
                written = x.numel() * 2
                eager = time_us(lambda: rms_norm(*inputs))
                comp = time_us(lambda: compiled_norm(*inputs))
            elif bits == "save":
                kcache.copy_(torch.randn_like(kcache, dtype=torch.float32))
                vcache.copy_(torch.randn_like(vcache, dtype=torch.float32))
                inputs = (kcache, vcache, slots)
                read = written  # The cache rows; the payload is written.
                if not had:
                    written = read
                    eager = time_us(lambda: save_raw(*inputs))
                    comp = time_us(lambda: compiled_save_raw(*inputs))
                else:
                    qbits, rotate = had
                    fused = functools.partial(save, bits=qbits, had=rotate)
                    compiled = torch.compile(fused, fullgraph=True,
                                             dynamic=False)
                    written = sum(t.numel() * t.element_size()
                                  for t in fused(*inputs))
                    eager = time_us(lambda: fused(*inputs))
                    comp = time_us(lambda: compiled(*inputs))
            elif bits == "rope":
                k = torch.randn(LAYERS, T, WIDTH, device=dev)
                v = torch.randn_like(k)
                cos_sin = torch.rand(T, HEAD, device=dev)
                inputs = (k, v, cos_sin, slots, kcache, vcache)
                read = 2 * k.numel() * 4 + cos_sin.numel() * 4
                eager = time_us(lambda: rope_scatter(*inputs))
                comp = time_us(lambda: compiled_rope(*inputs))
            elif bits is None:
                k = torch.randn(LAYERS, T, WIDTH, device=dev).bfloat16()
                v = torch.randn_like(k)
                inputs = (k, v, slots, kcache, vcache)
                read = 2 * k.numel() * 2
                eager = time_us(lambda: restore_raw(*inputs))
                comp = time_us(lambda: compiled_raw(*inputs))
            else:
                nbytes = WIDTH * bits // 8
                kq = torch.randint(0, 256, (LAYERS, T, nbytes),
                                   dtype=torch.uint8, device=dev)
                vq = torch.randint_like(kq, 0, 256)
                kparams = torch.rand(LAYERS, (T + GROUP - 1) // GROUP, WIDTH,
                                     2, device=dev).half()
                vparams = torch.rand(LAYERS, T, WIDTH // GROUP, 2,
                                     device=dev).half()
                inputs = (kq, kparams, vq, vparams, slots, kcache, vcache)
                fused = functools.partial(restore, bits=bits, had=had)
                compiled = torch.compile(fused, fullgraph=True, dynamic=False)
                read = sum(t.numel() * t.element_size()
                           for t in (kq, vq, kparams, vparams))
                eager = time_us(lambda: fused(*inputs))
                comp = time_us(lambda: compiled(*inputs))
            total = read + written
            a = torch.empty(total // 2, dtype=torch.uint8, device=dev)
            b = torch.empty_like(a)
            copy = time_us(lambda: b.copy_(a))
            print(f"{name:<28} {T:>6} {total / 1e6:>8.2f} {eager:>9.1f} "
                  f"{comp:>11.1f} {copy:>8.1f} {100 * copy / eager:>7.0f}% "
                  f"{100 * copy / comp:>6.0f}%")


if __name__ == "__main__":
    main()
