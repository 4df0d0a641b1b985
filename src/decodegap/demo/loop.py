"""A plain decode loop over the demo model, with no profiler of its own: the program `decodegap record` wraps.

    decodegap record --target decodegap.demo.model:DemoModel.step -- python3 -m decodegap.demo.loop --steps 30
"""

from __future__ import annotations

import argparse
import time

from decodegap.demo.config import KV_DTYPES, KV_READS, SCALES, make_config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m decodegap.demo.loop", description=__doc__)
    parser.add_argument("--scale", choices=SCALES, default=None)
    parser.add_argument("--kv-read", choices=KV_READS, default="full_cast")
    parser.add_argument("--kv-dtype", choices=KV_DTYPES, default="fp8")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--pool-slots", type=int)
    parser.add_argument("--context", type=int)
    parser.add_argument("--batch", type=int)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--cuda-graph", action="store_true")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)

    from decodegap.demo.model import DemoModel
    from decodegap.demo.runner import effective_kv_read, pick_device, set_kv_read, sync

    device = pick_device(args.device)
    kv_read, note = effective_kv_read(args.kv_read, device)
    if note:
        print(f"note: {note}")
    config = make_config(args.scale or ("full" if device.type == "cuda" else "tiny"), layers=args.layers,
                         pool_slots=args.pool_slots, context=args.context, batch=args.batch,
                         kv_dtype=args.kv_dtype, kv_read=kv_read)
    model = DemoModel(config, device)
    set_kv_read(model, kv_read, args.cuda_graph)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        model.step()  # one decode step: the function to pass as --target
    sync(device)
    elapsed = time.perf_counter() - t0
    print(f"{args.steps} steps of {kv_read} on {device}: {elapsed / args.steps * 1e3:.3f} ms/step (wall, "
          f"profiler windows included); last tokens {model.tokens.tolist()}")


if __name__ == "__main__":
    main()
