"""A real 2-process tensor-parallel-style run on the CPU (torch.distributed + gloo), captured with the record
library: the per-rank folder logic and collective accounting on traces torch itself wrote."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from decodegap.pipeline import analyze_path
from decodegap.report.json import report_dict

pytest.importorskip("torch")

PROGRAM = """
import os, sys, socket
import torch, torch.distributed as dist
import torch.multiprocessing as mp
from decodegap.capture import StepProfiler

def worker(rank, out, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(rank)
    w = torch.randn(128, 128)
    prof = StepProfiler(warmup=1, steps=3, timed_steps=1, out_dir=out, enabled=True, record_shapes=True,
                        target="toy:step")

    @prof.wrap
    def step(x):
        for _ in range(4):  # 4 layers, 2 all-reduces each, as tensor parallelism does
            x = x @ w
            dist.all_reduce(x)
            x = torch.nn.functional.silu(x @ w)
            dist.all_reduce(x)
        return x / x.norm()

    x = torch.randn(1, 128)
    for _ in range(5):
        x = step(x)
    dist.barrier()
    # The traces are written by now. Skip gloo's teardown: under load its destructor can abort the process
    # ("terminate called without an active exception"), which has nothing to do with what is tested here.
    sys.stdout.flush()
    os._exit(0)

if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(worker, args=(sys.argv[1], port), nprocs=2)
"""


@pytest.mark.slow
def test_two_gloo_ranks_each_analyzed(tmp_path):
    script = tmp_path / "tp_toy.py"
    script.write_text(textwrap.dedent(PROGRAM))
    out = tmp_path / "traces"
    run = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-2000:]
    assert len(list(out.glob("*.rank-*.decodegap.pt.trace.json.gz"))) == 2
    d = report_dict(analyze_path(out))
    assert [r["rank"] for r in d["ranks"]] == [0, 1]
    assert all(r["decode_steps"] == 3 for r in d["ranks"])
    assert d["slowest_rank"] in (0, 1)
    collective = [k for k in d["kernels"] if k["category"] == "collective"]
    assert collective and sum(k["calls_per_step"] for k in collective) == 8
    assert all(r["collective_ms_per_step"] > 0 for r in d["ranks"])
