"""Single-thread kernel choices behind the simulator's defaults (docs/performance.md).

    python benchmarks/kernels.py

Times, in CPU seconds of this process (``time.process_time``, so other load on the machine disturbs it
less than wall time), a training step of McMahan et al.'s CNN at batch 32 with and without the
channels-last memory format, and inference at several batch sizes; and the two condensation kernels of
FedDM / FedAF with their width-32 batch-normalised ConvNet on 28x28: a distribution-matching step (a
fresh network, 2 classes x (32 real + 10 synthetic) images, gradient to the images only) and a server
epoch on a 220-image synthetic set in one batch; and FedDC's gradient matching for one client of the
quick CIFAR-10 config, with the synthetic side batched over classes (``vmap``, the default) and class
by class. One intra-op thread, as fedskew's workers run. Prints images (or class-steps) per
CPU-second; the last line is a JSON object.
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


def _convnet(channels_last: bool) -> torch.nn.Module:
    m = create_model("convnet", in_channels=1, num_classes=10, image_size=28, net_width=32, net_norm="batchnorm")
    if channels_last:
        m = m.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return m


def dm_step(channels_last: bool, steps: int = 20, reps: int = 3) -> float:
    """Distribution-matching steps as distribution_matching runs them (frozen network, image gradient)."""
    torch.manual_seed(0)
    real = _fmt(torch.randn(64, 1, 28, 28), channels_last)
    syn = torch.randn(20, 1, 28, 28, requires_grad=True)
    best = float("inf")
    for _ in range(reps):
        t = time.process_time()
        for _ in range(steps):
            m = _convnet(channels_last).train().requires_grad_(False)
            emb = m.features(torch.cat([real, _fmt(syn, channels_last)]))
            gap0 = emb[:32].mean(0) - emb[64:74].mean(0)
            gap1 = emb[32:64].mean(0) - emb[74:].mean(0)
            loss = (gap0**2).sum() + (gap1**2).sum()
            loss.backward(inputs=[syn])
        best = min(best, time.process_time() - t)
    return 84 * steps / best


def server_epoch(channels_last: bool, epochs: int = 10, reps: int = 3) -> float:
    """Epochs of SGD on a 220-image set in one batch (FedDM / FedAF server training, batch 256)."""
    torch.manual_seed(0)
    m = _convnet(channels_last)
    x, y = _fmt(torch.randn(220, 1, 28, 28), channels_last), torch.randint(0, 10, (220,))
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    best = float("inf")
    for _ in range(reps):
        t = time.process_time()
        for _ in range(epochs):
            loss = torch.nn.functional.cross_entropy(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        best = min(best, time.process_time() - t)
    return 220 * epochs / best


# Class sizes of one FedDC client in round 1 of experiments/feddc/cifar10_quick.toml (seed 1): at
# Dirichlet alpha 0.05 a client holds a few large classes and several of one or two images, and each
# held class gets a synthetic image, so most matching steps are on tiny batches.
GM_CLASS_SIZES = (21, 855, 1, 1, 367)


def gm_client(batched: bool, iterations: int = 10, reps: int = 3) -> float:
    """FedDC's gradient matching for one client (``cnn``, 3x32x32, ipc 1, real batch 256, K draws).

    Returns class-steps (one class's matching step of one draw) per CPU-second, with the synthetic side
    batched over classes (``vmap``) or class by class.
    """
    from fedskew.condense import GMConfig, gradient_matching

    x = torch.randn(sum(GM_CLASS_SIZES), 3, 32, 32, generator=torch.Generator().manual_seed(0))
    y = torch.cat([torch.full((n,), c, dtype=torch.int64) for c, n in enumerate(GM_CLASS_SIZES)])

    def factory() -> torch.nn.Module:
        return create_model("cnn", in_channels=3, num_classes=10, image_size=32)

    cfg = GMConfig(iterations=iterations)
    best = float("inf")
    for _ in range(reps):
        t = time.process_time()
        gradient_matching(x, y, factory, cfg, torch.Generator().manual_seed(0), batched_ok=batched)
        best = min(best, time.process_time() - t)
    return iterations * len(GM_CLASS_SIZES) / best


def main() -> None:
    torch.set_num_threads(1)
    out: dict[str, float] = {}
    for cl in (False, True):
        out[f"train_b32_{'cl' if cl else 'nchw'}"] = training(cl)
    for b in (100, 250, 500, 1000):
        out[f"infer_b{b}_cl"] = inference(b, True)
    out["infer_b500_nchw"] = inference(500, False)
    for cl in (False, True):
        out[f"dm_step_{'cl' if cl else 'nchw'}"] = dm_step(cl)
        out[f"server_epoch_{'cl' if cl else 'nchw'}"] = server_epoch(cl)
    for k, v in out.items():
        print(f"{k:20s} {v:8.0f} images per CPU-second")
    for batched in (False, True):
        key = f"gm_client_{'vmap' if batched else 'loop'}"
        out[key] = gm_client(batched)
        print(f"{key:20s} {out[key]:8.0f} class-steps per CPU-second")
    print(json.dumps({k: round(v) for k, v in out.items()}))


if __name__ == "__main__":
    main()
