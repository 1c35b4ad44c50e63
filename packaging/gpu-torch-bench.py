"""PyTorch on the GPU: ../shared/bench/torch_train.py's loop (same models, Adam, batch sizes,
median samples/s of epochs 2..N) with the data and the model on cuda:0, for
packaging/gpu-check.sh. Last line: JSON like torch_train.py's.

    python3 packaging/gpu-torch-bench.py --bench .gpu-deps/bench --model mlp|cnn [--epochs N]
"""
import argparse
import json
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="folder with fmnist.py and models.py")
    ap.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--lr", type=float, default=1e-3)
    a = ap.parse_args()
    sys.path.insert(0, a.bench)
    import numpy as np
    import torch
    import fmnist
    import models

    dev = torch.device("cuda:0")
    batch = a.batch or (256 if a.model == "mlp" else 128)
    torch.manual_seed(0)
    # Full fp32 like TrainStudio's CUDA backend (no TF32 tensor cores).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    xtr, ytr, xte, yte = (torch.from_numpy(np.ascontiguousarray(t)).to(dev)
                          for t in fmnist.load(flat=a.model == "mlp"))
    model = (models.mlp() if a.model == "mlp" else models.cnn()).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, eps=1e-7)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator(device=dev).manual_seed(0)
    n = xtr.shape[0]
    rates, acc = [], 0.0
    for epoch in range(1, a.epochs + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        perm = torch.randperm(n, generator=gen, device=dev)
        total = 0.0
        for i in range(0, n, batch):
            idx = perm[i:i + batch]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xtr.index_select(0, idx)), ytr.index_select(0, idx))
            loss.backward()
            opt.step()
            total += loss.item() * idx.numel()  # a host sync per step, as TrainStudio's loss readback
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        rates.append(n / wall)
        with torch.no_grad():
            model.eval()
            acc = sum((model(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum().item()
                      for i in range(0, xte.shape[0], 1000)) / xte.shape[0]
            model.train()
        print(f"epoch {epoch}: {wall:.3f} s, {n / wall:.0f} samples/s, loss {total / n:.4f}, "
              f"test accuracy {acc:.4f}", flush=True)
    steady = rates[1:] or rates
    print(json.dumps(dict(framework="pytorch", device=torch.cuda.get_device_name(0), version=torch.__version__,
                          model=a.model, batch=batch, epochs=a.epochs,
                          samples_per_sec=statistics.median(steady), test_accuracy=acc)))


if __name__ == "__main__":
    main()
