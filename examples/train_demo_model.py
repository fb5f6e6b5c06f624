"""Train the bundled demo ViT on synthetic microscopy with planted ground truth.

Task: does a nuclear-stain field contain a mitotic cell (a metaphase plate or anaphase
figure)? The answer hangs on one to three small localized figures among many interphase
nuclei (``napari_attnreg.synthetic``), so the model must look at them. A small timm
VisionTransformer (class token, patch 8, 128x128 input, 4 blocks) is trained on CPU.

Classification alone does not get this from-scratch ViT off chance within a CPU budget (a
needle-in-a-haystack label; see the ablation in the model card), so an auxiliary loss uses
the planted masks (``--aux``):

- ``attention`` (default, the bundled weights): *attention guidance*, −log of the share of
  the last block's CLS attention (mean over heads) on the decisive tokens, abnormal images only.
- ``tokens``: a linear head on the final patch tokens (discarded after training) predicts
  which tokens hold a mitotic figure; the CLS attention itself is never supervised, so its
  concentration on the figures is learnt, not imposed.
- ``none``: classification only.

This is stated in the model card: the demo model is meant to have attention that means
something, so that the bootstrap statistics have a known answer to find.

Run from the repository root (about 10 minutes on 2 CPU cores)::

    python examples/train_demo_model.py --seed 0

Images go through the package's own preprocessing (``prepare_image``), so the model sees at
inference exactly what it saw in training. Writes ``models/demo_vit.{safetensors,json}``,
``models/MODEL_CARD.md`` and the sample image ``data/demo_cells.tif`` (+ mask).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from napari_attnreg.core.images import prepare_image
from napari_attnreg.synthetic import TRAINING_SCALE, make_cell_image, write_demo_files

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "napari_attnreg"
TRAIN_STREAM, TEST_STREAM = 0, 2
AUX_MODES = ("attention", "tokens", "none")


def make_split(n: int, stream: int, seed: int, size: int, patch: int) -> tuple[np.ndarray, ...]:
    """Prepared [0, 1] images, labels and per-token decisive coverage for one split."""
    images = np.empty((n, size, size), np.float32)
    labels = np.empty(n, np.int64)
    cover = np.empty((n, size // patch, size // patch), np.float32)
    for i in range(n):
        sample = make_cell_image([seed, stream, i], size=size, scale=TRAINING_SCALE,
                                 abnormal=i % 2 == 0, hard_negatives=False)
        prep = prepare_image(sample.image, patch_size=(patch, patch), mean=(0.0,), std=(1.0,),
                             target_size="native")
        images[i] = prep.tensor[0].numpy()
        labels[i] = sample.label
        g = size // patch
        cover[i] = sample.decisive_mask.reshape(g, patch, g, patch).mean(axis=(1, 3))
    return images, labels, cover


def build_model(args: argparse.Namespace) -> tuple[torch.nn.Module, dict]:
    from timm.models.vision_transformer import VisionTransformer

    kwargs = {"img_size": args.img_size, "patch_size": args.patch, "in_chans": 3, "num_classes": 2,
                  "embed_dim": args.embed_dim, "depth": args.depth, "num_heads": args.heads, "mlp_ratio": 4.0,
                  "class_token": True, "global_pool": "token", "qkv_bias": True}
    return VisionTransformer(**kwargs), kwargs


def forward_with_attention(model, x):
    """Logits and last-block CLS→patch attention (mean over heads), differentiable."""
    captured = {}
    attn = model.blocks[-1].attn
    attn.fused_attn = False
    handle = attn.attn_drop.register_forward_hook(lambda m, i, o: captured.update(a=o))
    try:
        logits = model(x)
    finally:
        handle.remove()
        attn.fused_attn = True
    return logits, captured["a"][:, :, 0, model.num_prefix_tokens:].mean(1)


def augment(x: torch.Tensor, cover: torch.Tensor, gen: torch.Generator):
    """Random flips and 90° rotations, applied alike to the images and the token masks."""
    k = int(torch.randint(0, 4, (1,), generator=gen))
    x, cover = torch.rot90(x, k, (-2, -1)), torch.rot90(cover, k, (-2, -1))
    if bool(torch.randint(0, 2, (1,), generator=gen)):
        x, cover = x.flip(-1), cover.flip(-1)
    gain = 1 + 0.2 * (torch.rand(x.shape[0], 1, 1, 1, generator=gen) - 0.5)
    return x * gain, cover


@torch.no_grad()
def evaluate(model, images, labels, cover, mean, std, batch=256) -> dict:
    model.eval()
    correct, mass, area, enrich = 0, [], [], []
    for s in range(0, len(images), batch):
        x = (torch.from_numpy(images[s:s + batch])[:, None].expand(-1, 3, -1, -1) - mean) / std
        logits, att = forward_with_attention(model, x)
        y = torch.from_numpy(labels[s:s + batch])
        correct += int((logits.argmax(1) == y).sum())
        cov = torch.from_numpy(cover[s:s + batch]).flatten(1)
        for a, c, lab in zip(att, cov, y):
            if lab == 1 and c.sum() > 0:
                inside = c >= 0.25
                mass.append(float(a[inside].sum() / a.sum()))
                area.append(float(inside.float().mean()))
                enrich.append(mass[-1] / area[-1])
    return {"accuracy": correct / len(images), "attention_mass_in_mask": float(np.mean(mass)),
            "mask_area_fraction": float(np.mean(area)), "enrichment_median": float(np.median(enrich))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-train", type=int, default=6000)
    ap.add_argument("--n-test", type=int, default=400)
    ap.add_argument("--epochs", type=int, default=14)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--guidance", type=float, default=0.3, help="weight of the auxiliary loss")
    ap.add_argument("--aux", choices=AUX_MODES, default="attention",
                    help="auxiliary loss on the planted masks: CLS-attention guidance, a per-token "
                         "head on the patch features, or none")
    ap.add_argument("--img-size", type=int, default=128)
    ap.add_argument("--patch", type=int, default=8)
    ap.add_argument("--embed-dim", type=int, default=128)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=PACKAGE / "models")
    ap.add_argument("--data-out", type=Path, default=PACKAGE / "data")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    tr_x, tr_y, tr_c = make_split(args.n_train, TRAIN_STREAM, args.seed, args.img_size, args.patch)
    te_x, te_y, te_c = make_split(args.n_test, TEST_STREAM, args.seed, args.img_size, args.patch)
    t_data = time.perf_counter() - t0
    print(f"data: {len(tr_x)} train + {len(te_x)} test images in {t_data:.0f} s", flush=True)
    mean, std = float(tr_x.mean()), float(tr_x.std())

    model, kwargs = build_model(args)
    params = list(model.parameters())
    if args.aux == "tokens":
        # training-only head on the final (normed) patch tokens; not part of the saved model
        token_head = torch.nn.Linear(args.embed_dim, 1)
        params += list(token_head.parameters())
        features = {}
        model.norm.register_forward_hook(lambda m, i, o: features.update(tokens=o))
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.05)
    steps = args.epochs * (len(tr_x) // args.batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(args.seed)
    t1 = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(tr_x), generator=gen)
        run_cls = run_att = 0.0
        n_batches = len(tr_x) // args.batch_size
        for b in range(n_batches):
            idx = order[b * args.batch_size:(b + 1) * args.batch_size].numpy()
            x = torch.from_numpy(tr_x[idx])[:, None]
            cover = torch.from_numpy(tr_c[idx])
            x, cover = augment(x, cover, gen)
            x = (x.expand(-1, 3, -1, -1) - mean) / std
            y = torch.from_numpy(tr_y[idx])
            logits, att = forward_with_attention(model, x)
            loss_cls = F.cross_entropy(logits, y)
            pos = (y == 1) & (cover.flatten(1).sum(1) > 0)
            if args.aux == "tokens":
                tok_logits = token_head(features["tokens"][:, model.num_prefix_tokens:]).squeeze(-1)
                target = (cover.flatten(1) >= 0.25).float()
                # ~3 % of tokens are positive: up-weight them so the head does not predict all-zero
                loss_att = F.binary_cross_entropy_with_logits(tok_logits, target, pos_weight=torch.tensor(5.0))
            elif args.aux == "attention" and pos.any():
                inside = (cover.flatten(1)[pos] >= 0.25).float()
                share = (att[pos] * inside).sum(1) / att[pos].sum(1)
                loss_att = -torch.log(share.clamp_min(1e-6)).mean()
            else:
                loss_att = torch.zeros(())
            loss = loss_cls + args.guidance * loss_att
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            run_cls += float(loss_cls.detach())
            run_att += float(loss_att.detach())
        metrics = evaluate(model, te_x[:200], te_y[:200], te_c[:200], mean, std)
        print(json.dumps({"epoch": epoch, "loss_cls": run_cls / n_batches, "loss_att": run_att / n_batches,
                          **metrics, "minutes": (time.perf_counter() - t1) / 60}), flush=True)
    t_train = time.perf_counter() - t1
    final = evaluate(model, te_x, te_y, te_c, mean, std)
    print("held-out:", json.dumps(final), flush=True)

    from safetensors.torch import save_file

    args.out.mkdir(parents=True, exist_ok=True)
    model.eval()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(args.out / "demo_vit.safetensors"))
    config = {
        "timm_kwargs": kwargs, "mean": [mean] * 3, "std": [std] * 3, "classes": ["normal", "mitotic"],
        "input_size": [3, args.img_size, args.img_size], "sample_image": "demo_cells.tif",
        "trained_with": "python examples/train_demo_model.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("out", "data_out")),
        "held_out": final, "training_seconds": t_train, "data_seconds": t_data,
    }
    (args.out / "demo_vit.json").write_text(json.dumps(config, indent=2))
    n_params = sum(p.numel() for p in model.parameters())
    (args.out / "MODEL_CARD.md").write_text(model_card(config, n_params, args))
    img, mask = write_demo_files(args.data_out)
    print(f"wrote {args.out}/demo_vit.* and {img}, {mask}")
    return 0


_LOSS_TEXT = {
    "attention": (
        "Loss = cross-entropy + {w} x attention guidance, where attention guidance is\n"
        "−log(share of the last block's mean CLS attention on tokens ≥ 25 % covered by a mitotic "
        "figure),\non abnormal images only. **The demo model's attention was encouraged to look at "
        "the decisive\nobjects**: it is a test article with a known answer for the bootstrap "
        "statistics, not a\ndiscovery about mitosis."),
    "tokens": (
        "Loss = cross-entropy + {w} x token loss: a linear head on the final patch tokens (dropped "
        "after\ntraining) predicts which tokens are ≥ 25 % covered by a mitotic figure (binary "
        "cross-entropy,\npositives weighted 5x). The CLS attention itself is never supervised; "
        "its concentration on the\nfigures is learnt. It is a test article with a known answer "
        "for the bootstrap statistics,\nnot a discovery about mitosis."),
    "none": "Loss = cross-entropy only.",
}

# Measured once with this script (seed 0, 3200 images, 6 epochs, same settings as the bundled
# weights, --out elsewhere); not re-run by a training run.
ABLATION = """**Ablation: why an auxiliary loss.** Same settings, 400 held-out images (stream 2):

| `--aux` (weight) | held-out accuracy | CLS attention on mitotic tokens | their area | median enrichment |
|---|---:|---:|---:|---:|
| `attention` (0.3), bundled | 0.843 | 83.1 % | 3.5 % | 25.6x |
| `tokens` (1.0), attention never supervised | 0.843 | 51.4 % | 3.5 % | 15.4x |
| `none` (classification only) | 0.515 | 4.9 % | 3.5 % | 1.1x |

Classification alone stays at chance within this CPU budget (5 min of training); a per-token
auxiliary head that never touches the attention already makes the CLS attention concentrate on
the figures, and attention guidance concentrates it further.
"""


def model_card(cfg: dict, n_params: int, args: argparse.Namespace) -> str:
    k, h = cfg["timm_kwargs"], cfg["held_out"]
    return f"""# Demo model card: `demo` (napari-attnreg)

**Architecture.** timm `VisionTransformer`: {k['depth']} blocks, width {k['embed_dim']},
{k['num_heads']} heads, patch {k['patch_size']}, input {k['img_size']}x{k['img_size']}x3, class
token, {n_params / 1e6:.2f} M parameters. Grayscale input is repeated to 3 channels by
`prepare_image`; normalisation mean {cfg['mean'][0]:.4f}, std {cfg['std'][0]:.4f} (per channel).

**Data.** `napari_attnreg.synthetic.make_cell_image` at 128x128 px, magnification
`scale={TRAINING_SCALE}` (a 512x512 field at `scale={TRAINING_SCALE * 4}` looks the same after
the model's resize): interphase nuclei of varied size, shape, texture and density on an uneven,
vignetted background, Gaussian PSF blur, Poisson shot noise and Gaussian read noise, debris.
Label 1 ("mitotic") iff the field holds 1–3 metaphase plates or anaphase figures; their masks
are the ground truth. {args.n_train} training images (seed stream 0), {args.n_test} held-out
images (stream 2), balanced classes.

**Training.** `{cfg['trained_with']}`. AdamW (lr {args.lr}, one-cycle, weight decay 0.05),
batch {args.batch_size}, {args.epochs} epochs, flips/rot90 and gain augmentation, on
{args.threads} CPU threads: {cfg['training_seconds'] / 60:.1f} min training
(+{cfg['data_seconds']:.0f} s data generation).
{_LOSS_TEXT[args.aux].format(w=args.guidance)}

**Held-out results** ({args.n_test} images): accuracy {h['accuracy']:.3f}; in abnormal images
the mitotic tokens cover {100 * h['mask_area_fraction']:.1f} % of the image but receive
{100 * h['attention_mass_in_mask']:.1f} % of the CLS attention (median enrichment
{h['enrichment_median']:.1f}x).

{ABLATION}
**Intended use.** Offline demos, tests and validation of napari-attnreg. Not for any
biological or clinical decision.
"""


if __name__ == "__main__":
    raise SystemExit(main())
