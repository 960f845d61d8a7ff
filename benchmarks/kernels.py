"""Single-thread kernel choices behind the simulator's defaults (docs/performance.md).

    python benchmarks/kernels.py

Times, in CPU seconds of this process (``time.process_time``, so other load on the machine disturbs it
less than wall time), a training step of McMahan et al.'s CNN at batch 32 with and without the
channels-last memory format, and inference at several batch sizes. One intra-op thread, as fedskew's
workers run. Prints images per CPU-second; the last line is a JSON object.
"""

from __future__ import annotations

import json
import time

import torch

from fedskew.models import create_model

N_EVAL = 4000


def _model(channels_last: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    m = create_model("fedavg_cnn", in_channels=1, num_classes=10, image_size=28)
    if channels_last:
        m = m.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return m


def _fmt(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def inference(batch: int, channels_last: bool, reps: int = 3) -> float:
    m = _model(channels_last).eval()
    x = torch.randn(N_EVAL, 1, 28, 28)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(reps):
            t = time.process_time()
            for i in range(0, N_EVAL, batch):
                m(_fmt(x[i : i + batch], channels_last))
            best = min(best, time.process_time() - t)
    return N_EVAL / best


def training(channels_last: bool, steps: int = 40, batch: int = 32, reps: int = 3) -> float:
    m = _model(channels_last)
    x, y = torch.randn(batch * steps, 1, 28, 28), torch.randint(0, 10, (batch * steps,))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    best = float("inf")
    for _ in range(reps):
        t = time.process_time()
        for i in range(steps):
            xb = _fmt(x[i * batch : (i + 1) * batch], channels_last)
            loss = torch.nn.functional.cross_entropy(m(xb), y[i * batch : (i + 1) * batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
        best = min(best, time.process_time() - t)
    return batch * steps / best


def main() -> None:
    torch.set_num_threads(1)
    out: dict[str, float] = {}
    for cl in (False, True):
        out[f"train_b32_{'cl' if cl else 'nchw'}"] = training(cl)
    for b in (100, 250, 500, 1000):
        out[f"infer_b{b}_cl"] = inference(b, True)
    out["infer_b500_nchw"] = inference(500, False)
    for k, v in out.items():
        print(f"{k:20s} {v:8.0f} images per CPU-second")
    print(json.dumps({k: round(v) for k, v in out.items()}))


if __name__ == "__main__":
    main()
