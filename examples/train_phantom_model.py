"""Train the bundled phantom ViT on CT-like slices with planted lesions.

Task: does an abdominal phantom slice contain a lesion? Normal and abnormal slices share the
same anatomy, texture and noise model (``napari_attnreg.testing.phantoms``); the label hangs on
one to three small, low-contrast, round hypo- or hyperdense lesions in the liver or spleen,
about one to two 16 px patches across, among bright round structures (aorta, kidneys) and dark
ones (bowel gas) present in both classes. A small timm VisionTransformer (class token, patch 16,
224x224 input, 4 blocks) is trained on CPU with the same recipe as the demo model
(``training_common``): cross-entropy plus attention guidance on the lesion masks (``--aux``),
plus the spread term (``--spread``) that keeps the attention flat where no lesion is, so that it
is peaked *only* where a lesion is. Normal and abnormal training slices come in pairs of one
seed (see :func:`draw_slice`).

The bundled weights come from four runs, each but the first starting from the weights of the
one before (``--init``); ``models/phantom_vit.json`` lists them under ``stages``. Stages 1–3
spread the attention of normal *and* null images (entropy). That taught the model to give
block-shuffled slices, the step-down's own null images, flatter attention than any real slice,
so the step-down found every patch of every slice. Stage 4 spreads the attention on normal
slices and outside the lesions of abnormal ones only (``--spread-kind logsd --spread-outside
--spread-nulls off``, random zoom crops ``--zoom 0.6``), and leaves null images alone.

This is the second test article of the package, from another domain than the fluorescence
demo: its attention was encouraged to look at the lesions, so the bootstrap statistics have a
known answer to find on radiology-like grey images. It is not a radiology model.

Run from the repository root (stage 1, about 20 minutes on 2 CPU cores; the later stages take
2–3 minutes each)::

    python examples/train_phantom_model.py --seed 0
    python examples/train_phantom_model.py --seed 0 --epochs 6 --lr 3e-4 --guidance 1.0 \
        --spread 1.0 --spread-kind logsd --spread-outside --spread-nulls off --zoom 0.6 \
        --init <stage-3 weights>

Writes ``models/phantom_vit.{safetensors,json}``, ``models/PHANTOM_MODEL_CARD.md`` and the
sample slice ``data/phantom_slice.tif`` (+ mask).
"""

from __future__ import annotations

import argparse

import numpy as np
from training_common import (
    architecture_text,
    held_out_text,
    run,
    training_text,
)

from napari_attnreg.testing.phantoms import (
    HU_OFFSET,
    PHANTOM_SEED,
    SAMPLE_SIZE,
    make_phantom_image,
    write_phantom_files,
)


def draw_slice(seed: list[int], size: int, abnormal: bool) -> tuple[np.ndarray, int, np.ndarray]:
    """One training slice (float32 HU): image, label and the mask of its lesions.

    Slices come in pairs: images ``2j`` (abnormal) and ``2j + 1`` (normal) share the seed
    ``[seed, stream, j]``, hence anatomy, texture and noise, and differ only at the lesions, so
    the only thing that tells the classes apart is the lesions themselves.
    """
    *head, i = seed
    sample = make_phantom_image([*head, i // 2], size=size, abnormal=abnormal)
    return sample.image, sample.label, sample.lesion_mask


def main(argv: list[str] | None = None) -> int:
    return run(argv, __doc__.split("\n\n")[0],
               {"n_train": 2400, "epochs": 12, "batch_size": 32, "lr": 1.5e-3, "guidance": 0.3,
                "spread": 0.3, "img_size": 224, "patch": 16, "embed_dim": 64, "heads": 4},
               draw_slice, write_sample=write_phantom_files, script="train_phantom_model.py",
               stem="phantom_vit", classes=["normal", "lesion"], sample_image="phantom_slice.tif",
               card=model_card, card_name="PHANTOM_MODEL_CARD.md")


def model_card(cfg: dict, n_params: int, args: argparse.Namespace) -> str:
    return f"""# Phantom model card: `phantom` (napari-attnreg)

A synthetic **test article**, the radiology-like counterpart of the `demo` model: a tiny ViT
whose CLS attention has a known answer (the planted lesions), so that the package's bootstrap
statistics can be validated on grey CT-like images. **It is not a radiology model**: it has
never seen a real scan and must not be used on one for any clinical purpose.

{architecture_text(cfg, n_params)}
Load it offline with `load_backbone("phantom")` (1 prefix token, input (3, 224, 224)).

**Data.** `napari_attnreg.testing.phantoms.make_phantom_image` at {args.img_size}x{args.img_size} px,
float32 Hounsfield units: an axial abdominal slice with a jittered body outline, subcutaneous
fat, liver, spleen, kidneys, aorta, a vertebra and bowel gas, each with its own density and
smooth texture, partial-volume blur and correlated CT noise (6–15 HU). Label 1 ("lesion") iff
the slice holds 1–3 planted lesions in the liver or spleen: round, soft-edged, 9–14 px radius
(one to two 16 px patches across), 80–150 HU darker (60 %) or brighter (40 %) than their organ;
their masks are the ground truth. A normal slice of a seed differs from the abnormal one only at
the lesions, and the slices come in such pairs: {args.n_train} training slices ({args.n_train // 2}
seeds of stream 0, each drawn abnormal and normal), {args.n_test} held-out slices (stream 2,
likewise). The bundled sample `data/phantom_slice.tif` is a 512x512 uint16
slice (HU + {HU_OFFSET}) with two lesions, seed {PHANTOM_SEED}, outside both streams; at
{SAMPLE_SIZE} px it is resized to the model's 224 px input.

{training_text(cfg, args, obj="a lesion", model="phantom", topic="radiology")}

{held_out_text(cfg, args, "lesion")}

**Limits.** Everything here is synthetic: geometric organs, no real anatomy, scanner physics or
pathology. The model answers "is there a planted lesion in this phantom?" and nothing else; its
attention was trained to land on the lesions and to stay spread out where there is none, which
is what makes it a test article: a bootstrap against null images (the slice's blocks shuffled)
has something to find on an abnormal slice and nothing on a normal one. The first three stages
saw block-shuffled slices and noise in training (the last did not), so the null images of the
bootstrap are not entirely new to it; that is part of the article's history, not a property of
real models.

**Intended use.** Offline demos, tests and validation of napari-attnreg on radiology-like grey
images. Not for any clinical decision.
"""


if __name__ == "__main__":
    raise SystemExit(main())
