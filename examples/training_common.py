"""What the bundled test-article models share: splits, the ViT, attention guidance, export.

``train_demo_model.py`` (synthetic fluorescence, mitotic figures) and ``train_phantom_model.py``
(CT-like phantoms, lesions) differ only in their data, defaults and model card; the training
recipe is this one, so both articles are made the same way:

- images go through the package's own preprocessing (``prepare_image``), so the model sees at
  inference exactly what it saw in training;
- a small timm ``VisionTransformer`` (class token) is trained on CPU with cross-entropy plus an
  auxiliary loss on the planted masks (``--aux``): ``attention`` guidance, −log of the share of
  the last block's CLS attention (mean over heads) on the decisive tokens of abnormal images;
  ``tokens``, a linear head on the final patch tokens (discarded after training) that predicts
  the decisive tokens, so the CLS attention itself is never supervised; or ``none``;
- optionally (``--spread``) a term that keeps the CLS attention *spread out* where there is
  nothing decisive, on normal images, on null images made in each batch (the abnormal images
  with their 4 or 8 px blocks shuffled, and Gaussian noise; no label loss; ``--spread-nulls
  off`` leaves them out) and, with ``--spread-outside``, on the tokens of abnormal images that
  no decisive object touches. ``--spread-kind`` says how spread is measured: ``entropy`` (1 −
  normalised entropy), ``peak`` (the largest share) or ``logsd`` (the sd of log attention).
  Guidance alone makes the attention peak on some token of every input, lesion or not, and
  then a bootstrap against null images finds nothing; spreading the null images' attention
  teaches the model to tell them from real images, and then it finds everything;
- optionally (``--zoom``) random zoom crops, so that the model behaves alike at the scales an
  analyst crops to;
- held-out metrics: accuracy, the share of CLS attention on the decisive tokens against
  their share of the area (enrichment), and the median largest token share (top-1) of the
  attention on abnormal, normal, block-shuffled (8 px) and Gaussian-noise images.

Run the scripts from the repository root; this module sits next to them and is imported as
``training_common``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from napari_attnreg.core.run.images import prepare_image

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "napari_attnreg"
TRAIN_STREAM, TEST_STREAM = 0, 2
AUX_MODES = ("attention", "tokens", "none")
SPREAD_KINDS = ("entropy", "peak", "logsd", "peak+logsd")
PEAK_POWER = 8.0  # the smooth maximum is the L8 norm of the shares: near the largest share
COVER_MIN = 0.25  # a token is decisive when a decisive object covers at least this share of it

# draw(seed, size, abnormal) -> (image, label, decisive mask)
Draw = Callable[[list[int], int, bool], tuple[np.ndarray, int, np.ndarray]]


def make_split(draw: Draw, n: int, stream: int, seed: int, size: int, patch: int) -> tuple[np.ndarray, ...]:
    """Prepared [0, 1] images, labels and per-token decisive coverage for one split.

    Image ``i`` is drawn with the seed ``[seed, stream, i]``, abnormal for even ``i``.
    """
    images = np.empty((n, size, size), np.float32)
    labels = np.empty(n, np.int64)
    cover = np.empty((n, size // patch, size // patch), np.float32)
    for i in range(n):
        image, label, mask = draw([seed, stream, i], size, i % 2 == 0)
        prep = prepare_image(image, patch_size=(patch, patch), mean=(0.0,), std=(1.0,),
                             target_size="native")
        images[i] = prep.tensor[0].numpy()
        labels[i] = label
        g = size // patch
        cover[i] = mask.reshape(g, patch, g, patch).mean(axis=(1, 3))
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


def zoom(x: torch.Tensor, cover: torch.Tensor, smallest: float, gen: torch.Generator):
    """A random square crop of ``smallest``–1 of the side, resized back (images and coverage).

    Analysts crop and zoom; without this the model only knows the one scale of its training
    images. The coverage of the tokens is carried along at pixel resolution.
    """
    if smallest >= 1:
        return x, cover
    n, _, h, w = x.shape
    side = int(h * (smallest + (1 - smallest) * float(torch.rand((), generator=gen))))
    y0, x0 = (int(torch.randint(0, h - side + 1, (1,), generator=gen)) for _ in range(2))
    x = F.interpolate(x[..., y0:y0 + side, x0:x0 + side], size=(h, w), mode="bilinear",
                      antialias=True, align_corners=False)
    px = F.interpolate(cover[:, None], size=(h, w), mode="nearest")[..., y0:y0 + side, x0:x0 + side]
    return x, F.adaptive_avg_pool2d(px, cover.shape[-2:])[:, 0]


def shuffle_blocks(x: torch.Tensor, block: int, gen: torch.Generator) -> torch.Tensor:
    """``(B, 1, H, W)`` images with their ``block`` px blocks permuted (each image its own way)."""
    n, _, h, w = x.shape
    gy, gx = h // block, w // block
    t = x.reshape(n, gy, block, gx, block).permute(0, 1, 3, 2, 4).reshape(n, gy * gx, block, block)
    perm = torch.argsort(torch.rand(n, gy * gx, generator=gen), dim=1)
    t = t[torch.arange(n)[:, None], perm]
    return t.reshape(n, gy, gx, block, block).permute(0, 1, 3, 2, 4).reshape(n, 1, h, w)


def noise_images(n: int, size: int, gen: torch.Generator) -> torch.Tensor:
    """Gaussian noise as ``prepare_image`` scales it (percentiles to [0, 1])."""
    return (0.5 + 0.17 * torch.randn(n, 1, size, size, generator=gen)).clamp(0, 1)


def make_nulls(x: torch.Tensor, gen: torch.Generator, n_noise: int) -> torch.Tensor:
    """Null images of a batch of prepared images: 4 or 8 px block shuffles, plus noise."""
    block = (4, 8)[int(torch.randint(0, 2, (1,), generator=gen))]
    return torch.cat([shuffle_blocks(x, block, gen), noise_images(n_noise, x.shape[-1], gen)])


def _top1(att: torch.Tensor) -> list[float]:
    return (att.max(1).values / att.sum(1)).tolist()


@torch.no_grad()
def evaluate(model, images, labels, cover, mean, std, batch=256) -> dict:
    model.eval()
    correct, mass, area, enrich = 0, [], [], []
    top1: dict[str, list[float]] = {"abnormal": [], "normal": [], "shuffled": [], "noise": []}
    gen = torch.Generator().manual_seed(1)
    for s in range(0, len(images), batch):
        x0 = torch.from_numpy(images[s:s + batch])[:, None]
        x = (x0.expand(-1, 3, -1, -1) - mean) / std
        logits, att = forward_with_attention(model, x)
        y = torch.from_numpy(labels[s:s + batch])
        correct += int((logits.argmax(1) == y).sum())
        top1["abnormal"] += _top1(att[y == 1])
        top1["normal"] += _top1(att[y == 0])
        for key, null in (("shuffled", shuffle_blocks(x0[y == 0], 8, gen)),
                          ("noise", noise_images(int((y == 0).sum()), x0.shape[-1], gen))):
            top1[key] += _top1(forward_with_attention(model, (null.expand(-1, 3, -1, -1) - mean) / std)[1])
        cov = torch.from_numpy(cover[s:s + batch]).flatten(1)
        for a, c, lab in zip(att, cov, y):
            if lab == 1 and c.sum() > 0:
                inside = c >= COVER_MIN
                mass.append(float(a[inside].sum() / a.sum()))
                area.append(float(inside.float().mean()))
                enrich.append(mass[-1] / area[-1])
    return {"accuracy": correct / len(images), "attention_mass_in_mask": float(np.mean(mass)),
            "mask_area_fraction": float(np.mean(area)), "enrichment_median": float(np.median(enrich)),
            **{f"top1_median_{k}": float(np.median(v)) for k, v in top1.items()},
            "uniform_share": 1.0 / cover.shape[1] / cover.shape[2]}


def build_parser(description: str, **defaults: Any) -> argparse.ArgumentParser:
    """The options every training script takes; ``defaults`` are the script's own values.

    ``defaults`` must give n_train, epochs, lr, img_size, patch, embed_dim and heads.
    """
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-train", type=int)
    ap.add_argument("--n-test", type=int, default=400)
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--guidance", type=float, default=0.3, help="weight of the auxiliary loss")
    ap.add_argument("--aux", choices=AUX_MODES, default="attention",
                    help="auxiliary loss on the planted masks: CLS-attention guidance, a per-token "
                         "head on the patch features, or none")
    ap.add_argument("--spread", type=float, default=0.0,
                    help="weight of the attention-spreading term on normal and null images; 0 = off")
    ap.add_argument("--spread-kind", choices=SPREAD_KINDS, default="entropy",
                    help="entropy: 1 − normalised entropy of the CLS attention; peak: log of its "
                         "largest share (a smooth maximum) against a uniform map's")
    ap.add_argument("--spread-nulls", choices=("on", "off"), default="on",
                    help="also spread the attention of null images made in each batch (block "
                         "shuffles, noise); off: the model never sees a null image in training")
    ap.add_argument("--spread-from", type=int, default=0,
                    help="first epoch of the spread term (earlier epochs learn the task alone)")
    ap.add_argument("--spread-outside", action="store_true",
                    help="also spread the attention of abnormal images over their tokens outside "
                         "the decisive objects (re-normalised there)")
    ap.add_argument("--zoom", type=float, default=1.0,
                    help="smallest side of a random zoom crop, as a share of the image (1: off)")
    ap.add_argument("--img-size", type=int)
    ap.add_argument("--patch", type=int)
    ap.add_argument("--embed-dim", type=int)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--init", type=Path, default=None,
                    help="start from these weights (a .safetensors of the same architecture), "
                         "e.g. to fine-tune an earlier run with another loss")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=PACKAGE / "models")
    ap.add_argument("--data-out", type=Path, default=PACKAGE / "data")
    ap.set_defaults(**defaults)
    return ap


def _aux_loss(args, model, token_head, features, att, y, cover) -> torch.Tensor:
    """The auxiliary loss of one batch (see the module docstring)."""
    pos = (y == 1) & (cover.flatten(1).sum(1) > 0)
    if args.aux == "tokens":
        tok_logits = token_head(features["tokens"][:len(y), model.num_prefix_tokens:]).squeeze(-1)
        target = (cover.flatten(1) >= COVER_MIN).float()
        # few tokens are positive: up-weight them so the head does not predict all-zero
        return F.binary_cross_entropy_with_logits(tok_logits, target, pos_weight=torch.tensor(5.0))
    if args.aux == "attention" and pos.any():
        inside = (cover.flatten(1)[pos] >= COVER_MIN).float()
        share = (att[pos] * inside).sum(1) / att[pos].sum(1)
        return -torch.log(share.clamp_min(1e-6)).mean()
    return torch.zeros(())


def _spread_loss(att: torch.Tensor, kind: str = "entropy", keep: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """How far each attention row is from uniform over its ``keep`` tokens, averaged (0: uniform).

    ``entropy``: 1 − normalised entropy (1 on one token). ``peak``: log of the L8 norm of the
    shares over a uniform map's, i.e. about log(T · largest share); the step-down's first step
    compares exactly that largest share with the null maps', which an entropy barely sees.
    """
    if not len(att):
        return torch.zeros(())
    keep = torch.ones_like(att, dtype=torch.bool) if keep is None else keep
    n = keep.sum(1).clamp_min(1).float()
    p = torch.where(keep, att, torch.zeros_like(att))
    p = p / p.sum(1, keepdim=True).clamp_min(1e-12)
    if kind == "peak+logsd":
        return _spread_loss(att, "peak", keep) + _spread_loss(att, "logsd", keep)
    if kind == "peak":
        logp = torch.log(p.clamp_min(1e-12)).masked_fill(~keep, float("-inf"))
        norm = torch.logsumexp(PEAK_POWER * logp, dim=1) / PEAK_POWER
        return (norm + torch.log(n) * (1 - 1 / PEAK_POWER)).mean()
    if kind == "logsd":
        logp = torch.log(p.clamp_min(1e-12))
        mean = (logp * keep).sum(1) / n
        var = (((logp - mean[:, None]) ** 2) * keep).sum(1) / n
        return torch.sqrt(var + 1e-8).mean()
    entropy = -(p * torch.log(p.clamp_min(1e-12))).sum(1)
    return (1 - entropy / torch.log(n.clamp_min(2))).mean()


def _spread_term(args, att: torch.Tensor, y: torch.Tensor, cover: torch.Tensor, n: int) -> torch.Tensor:
    """The spread loss of a batch: normal images, null images and (``--spread-outside``) the
    tokens of abnormal images that no decisive object touches."""
    rows = torch.cat([att[:n][y == 0], att[n:]])
    loss = _spread_loss(rows, args.spread_kind)
    if args.spread_outside and bool((y == 1).any()):
        outside = cover.flatten(1)[y == 1] == 0
        loss = loss + _spread_loss(att[:n][y == 1], args.spread_kind, keep=outside)
    return loss


def fit(args: argparse.Namespace, train: tuple[np.ndarray, ...], test: tuple[np.ndarray, ...]
        ) -> tuple[torch.nn.Module, dict, float, float, dict, float]:
    """Train on ``train`` (images, labels, coverage), printing held-out metrics each epoch.

    Returns
    -------
    model, timm kwargs, normalisation mean and std, final held-out metrics, training seconds
    """
    tr_x, tr_y, tr_c = train
    te_x, te_y, te_c = test
    mean, std = float(tr_x.mean()), float(tr_x.std())

    model, kwargs = build_model(args)
    if args.init is not None:
        from safetensors.torch import load_file

        model.load_state_dict(load_file(str(args.init)))
    params = list(model.parameters())
    token_head, features = None, {}
    if args.aux == "tokens":
        # training-only head on the final (normed) patch tokens; not part of the saved model
        token_head = torch.nn.Linear(args.embed_dim, 1)
        params += list(token_head.parameters())
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
            x, cover = augment(*zoom(x, cover, args.zoom, gen), gen)
            y = torch.from_numpy(tr_y[idx])
            n = len(y)
            spread = args.spread if epoch >= args.spread_from else 0.0
            if spread > 0 and args.spread_nulls == "on":  # null images ride along, no label loss
                x = torch.cat([x, make_nulls(x[y == 1][: n // 4], gen, n // 16)])
            x = (x.expand(-1, 3, -1, -1) - mean) / std
            logits, att = forward_with_attention(model, x)
            loss_cls = F.cross_entropy(logits[:n], y)
            loss_att = _aux_loss(args, model, token_head, features, att[:n], y, cover)
            loss = loss_cls + args.guidance * loss_att
            if spread > 0:
                loss = loss + spread * _spread_term(args, att, y, cover, n)
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
    return model, kwargs, mean, std, final, t_train


def _command_line(args: argparse.Namespace) -> str:
    """The options of this run as they are typed (flags without a value; outputs left out)."""
    words = []
    for key, value in vars(args).items():
        if key in ("out", "data_out") or value is False or value is None:
            continue
        flag = f"--{key.replace('_', '-')}"
        words.append(flag if value is True else f"{flag} {value}")
    return " ".join(words)


def train_and_export(args: argparse.Namespace, draw: Draw, *, script: str, stem: str,
                     classes: list[str], sample_image: str,
                     card: Callable[[dict, int, argparse.Namespace], str], card_name: str) -> dict:
    """Draw the splits, train, and write ``<stem>.safetensors``, ``<stem>.json`` and the card.

    Returns
    -------
    dict
        The config written to ``<stem>.json``.
    """
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    train = make_split(draw, args.n_train, TRAIN_STREAM, args.seed, args.img_size, args.patch)
    test = make_split(draw, args.n_test, TEST_STREAM, args.seed, args.img_size, args.patch)
    t_data = time.perf_counter() - t0
    print(f"data: {len(train[0])} train + {len(test[0])} test images in {t_data:.0f} s", flush=True)
    model, kwargs, mean, std, final, t_train = fit(args, train, test)

    from safetensors.torch import save_file

    args.out.mkdir(parents=True, exist_ok=True)
    model.eval()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(args.out / f"{stem}.safetensors"))
    config = {
        "timm_kwargs": kwargs, "mean": [mean] * 3, "std": [std] * 3, "classes": classes,
        "input_size": [3, args.img_size, args.img_size], "sample_image": sample_image,
        "trained_with": f"python examples/{script} " + _command_line(args),
        "held_out": final, "training_seconds": t_train, "data_seconds": t_data,
    }
    (args.out / f"{stem}.json").write_text(json.dumps(config, indent=2))
    n_params = sum(p.numel() for p in model.parameters())
    (args.out / card_name).write_text(card(config, n_params, args))
    return config


def run(argv: list[str] | None, description: str, defaults: dict[str, Any], draw: Draw, *,
        write_sample: Callable[[Path], tuple[Path, Path]], **export: Any) -> int:
    """A training script's ``main``: parse, train, export, then write the sample image.

    ``defaults`` go to :func:`build_parser`, ``export`` to :func:`train_and_export`.
    """
    args = build_parser(description, **defaults).parse_args(argv)
    train_and_export(args, draw, **export)
    img, mask = write_sample(args.data_out)
    print(f"wrote {args.out}/{export['stem']}.* and {img}, {mask}")
    return 0


_LOSS_TEXT = {
    "attention": (
        "Loss = cross-entropy + {w} x attention guidance, where attention guidance is\n"
        "−log(share of the last block's mean CLS attention on tokens ≥ 25 % covered by {obj}),"
        "\non abnormal images only. **The {model} model's attention was encouraged to look at "
        "the decisive\nobjects**: it is a test article with a known answer for the bootstrap "
        "statistics, not a\ndiscovery about {topic}."),
    "tokens": (
        "Loss = cross-entropy + {w} x token loss: a linear head on the final patch tokens (dropped "
        "after\ntraining) predicts which tokens are ≥ 25 % covered by {obj} (binary "
        "cross-entropy,\npositives weighted 5x). The CLS attention itself is never supervised; "
        "its concentration on the\nfigures is learnt. It is a test article with a known answer "
        "for the bootstrap statistics,\nnot a discovery about {topic}."),
    "none": "Loss = cross-entropy only.",
}


def architecture_text(cfg: dict, n_params: int) -> str:
    """The model card's architecture paragraph."""
    k = cfg["timm_kwargs"]
    return f"""**Architecture.** timm `VisionTransformer`: {k['depth']} blocks, width {k['embed_dim']},
{k['num_heads']} heads, patch {k['patch_size']}, input {k['img_size']}x{k['img_size']}x3, class
token, {n_params / 1e6:.2f} M parameters. Grayscale input is repeated to 3 channels by
`prepare_image`; normalisation mean {cfg['mean'][0]:.4f}, std {cfg['std'][0]:.4f} (per channel)."""


def training_text(cfg: dict, args: argparse.Namespace, *, obj: str, model: str, topic: str) -> str:
    """The model card's training paragraph, with the loss spelled out."""
    return f"""**Training.** `{cfg['trained_with']}`. AdamW (lr {args.lr}, one-cycle, weight decay 0.05),
batch {args.batch_size}, {args.epochs} epochs, flips/rot90 and gain augmentation, on
{args.threads} CPU threads: {cfg['training_seconds'] / 60:.1f} min training
(+{cfg['data_seconds']:.0f} s data generation).
{_LOSS_TEXT[args.aux].format(w=args.guidance, obj=obj, model=model, topic=topic)}{_spread_text(args)}"""


_SPREAD_MEASURE = {"entropy": "1 − normalised entropy", "peak": "the log of the largest share (a smooth maximum)",
                   "logsd": "the standard deviation of log attention",
                   "peak+logsd": "the log of the largest share plus the sd of log attention"}


def _spread_text(args: argparse.Namespace) -> str:
    if not args.spread:
        return ""
    where = ["normal images"]
    if getattr(args, "spread_nulls", "on") == "on":
        where.append("null images made in each batch (a quarter batch of its abnormal images with "
                     "their 4 or 8 px blocks shuffled, and a sixteenth of Gaussian noise; no label "
                     "loss on those)")
    if getattr(args, "spread_outside", False):
        where.append("the tokens of abnormal images that no decisive object touches (re-normalised "
                     "there)")
    zoom = getattr(args, "zoom", 1.0)
    zoom_text = (f" Random zoom crops of {zoom:g}–1 of the side, resized back, join the augmentation."
                 if zoom < 1 else "")
    return f"""
Plus {args.spread} x spread term, {_SPREAD_MEASURE[getattr(args, "spread_kind", "entropy")]}, on
the CLS attention of {"; and of ".join(where)}, so that the attention peaks only where there is a
decisive object.{zoom_text}"""


def held_out_text(cfg: dict, args: argparse.Namespace, tokens: str) -> str:
    """The model card's held-out paragraph; ``tokens`` names the decisive tokens."""
    h = cfg["held_out"]
    return f"""**Held-out results** ({args.n_test} images): accuracy {h['accuracy']:.3f}; in abnormal images
the {tokens} tokens cover {100 * h['mask_area_fraction']:.1f} % of the image but receive
{100 * h['attention_mass_in_mask']:.1f} % of the CLS attention (median enrichment
{h['enrichment_median']:.1f}x).{_top1_text(h)}"""


def _top1_text(h: dict) -> str:
    if "top1_median_abnormal" not in h:
        return ""
    return f""" Median largest token share of the CLS attention (uniform:
{h['uniform_share']:.4f}): abnormal {h['top1_median_abnormal']:.3f}, normal {h['top1_median_normal']:.3f},
normal with 8 px blocks shuffled {h['top1_median_shuffled']:.3f}, Gaussian noise
{h['top1_median_noise']:.3f}."""
