"""How each layer's singular directions drift during training, checkpoint by checkpoint.

Trains a small MLP on synthetic data on the CPU for a few hundred steps, saves a
checkpoint every ``--every`` steps (plain state dicts, loaded back with
``weights_only=True``), then compares every checkpoint with the first one::

    python examples/alignment_training.py [--steps 300] [--every 50]

Needs diffractml-kernels-spectral and diffractml-kernels-alignment.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from diffract import Session


def train(steps: int, every: int, folder: Path) -> list[Path]:
    """Train a 32-128-128-8 MLP on a random teacher; save checkpoints along the way."""
    torch.manual_seed(0)
    teacher = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 8))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    paths = []
    for step in range(steps + 1):
        if step % every == 0:
            path = folder / f"step{step:05d}.pt"
            torch.save(model.state_dict(), path)
            paths.append(path)
        if step == steps:
            break
        x = torch.randn(256, 32)
        loss = torch.nn.functional.mse_loss(model(x), teacher(x).detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=50)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        paths = train(args.steps, args.every, Path(tmp))
        with Session() as session:
            for path in paths:
                session.models.add(path, model_id=path.stem)
            session.compute.apply_pairs("avg_l_agreement", "l_subspace_overlap", pairs="first")
            values = session.results.export_aggregates("avg_l_agreement", "l_subspace_overlap")
    layers = ["0.weight", "2.weight", "4.weight"]
    first = paths[0].stem
    print("agreement of each layer with the first checkpoint (avg_l_agreement / "
          "l_subspace_overlap of the top tenth)")
    print(f"{'checkpoint':>12}  " + "  ".join(f"{layer:>17}" for layer in layers))
    for path in paths[1:]:
        cells = []
        for layer in layers:
            pair = f"@models[{first},{path.stem}]@params[{layer}]"
            cells.append(f"{values['avg_l_agreement' + pair]:.3f} / "
                         f"{values['l_subspace_overlap' + pair]:.3f}".rjust(17))
        print(f"{path.stem:>12}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
