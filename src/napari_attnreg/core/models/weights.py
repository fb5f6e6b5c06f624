"""Weights files: which suffixes hold weights, reading them into a state dict, loading one
into a timm ViT (with the position embedding resampled to the model's grid).

Files are read with ``weights_only`` torch loading or safetensors: a checkpoint's pickled
code is refused, never run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from napari_attnreg.core.models.errors import BackboneError

#: Suffixes of the weights files every route accepts (the pickers' filters say the same).
WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".ckpt", ".bin")


def folder_error(folder: Path, arch: str) -> BackboneError:
    """A folder given where a timm weights file belongs: name the files it holds."""
    found = sorted(p.name for p in folder.iterdir() if p.suffix.lower() in WEIGHT_SUFFIXES)
    inside = (f"; it holds {', '.join(found[:5])}: give one of those files" if found
              else f"; it holds no weights file ({', '.join(WEIGHT_SUFFIXES)})")
    return BackboneError(
        f"{folder} is a folder, but '{arch}' takes a single weights file{inside}. "
        "(A folder is only for transformers models saved with save_pretrained, with a "
        "config.json inside.)",
        gui_hint="Pick the weights file itself, not the folder that holds it.")


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Read a weights file and strip Lightning / DataParallel key prefixes.

    Parameters
    ----------
    path : Path
        ``.safetensors``, ``.pth``, ``.pt``, ``.bin`` or Lightning ``.ckpt``.
    """
    if path.is_dir():
        raise folder_error(path, "this model")
    if path.exists() and not path.is_file():  # /dev/zero, a pipe: endless or one-shot bytes
        raise BackboneError(f"{path} is not a regular file (a device or a pipe); give a "
                            "weights file.")
    if not path.is_file():
        raise BackboneError(f"Weights file not found: {path}")
    if path.stat().st_size == 0:
        raise BackboneError(f"The weights file {path} is empty (0 bytes): truncated, or never "
                            "written completely. Download or save it again.")
    if path.suffix.lower() == ".safetensors":
        state = _read_safetensors(path)
    else:
        state = _read_torch_file(path)
    for key in ("state_dict", "model", "model_state_dict", "teacher"):
        if isinstance(state, dict) and key in state and isinstance(state[key], dict):
            state = state[key]
            break
    if not isinstance(state, dict) or not state:
        raise BackboneError(f"{path} holds no state dict of tensors.")
    # the tensors only: a plain dict saved with an "epoch" or "args" entry beside the
    # "module."-named weights kept the prefix, and no key then matched the model's
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    for prefix in ("model.", "module.", "backbone.", "encoder."):
        if tensors and all(k.startswith(prefix) for k in tensors):
            tensors = {k[len(prefix):]: v for k, v in tensors.items()}
    if not tensors:
        raise BackboneError(f"{path} holds no tensors (its entries: "
                            f"{', '.join(map(str, list(state)[:5]))}); give a weights file.")
    _warn_unusual_dtypes(path, tensors)
    return tensors


def _warn_unusual_dtypes(path: Path, state: dict[str, torch.Tensor]) -> None:
    """Warn when weights or biases are stored as integers, booleans or float8: loading casts
    them to the model's float type silently, which loses precision or hides a wrong file."""
    odd = [(k, v.dtype) for k, v in state.items() if k.endswith((".weight", ".bias"))
           and (not v.dtype.is_floating_point or v.element_size() < 2)]
    if odd:
        import warnings

        names = ", ".join(f"{k} ({str(d).removeprefix('torch.')})" for k, d in odd[:3])
        more = f" and {len(odd) - 3} more" if len(odd) > 3 else ""
        warnings.warn(f"{path.name} stores weights as integers, booleans or float8: {names}"
                      f"{more}. They are cast to the model's float type; check that this is "
                      "the right (unquantized) weights file.", UserWarning, stacklevel=3)


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise BackboneError(
            f"{path} is not a readable .safetensors file ({err}); it may be truncated, "
            "corrupt or another format renamed. Download it again, or give the original file."
        ) from err


def _read_torch_file(path: Path) -> Any:
    """``torch.load`` with ``weights_only``: pickled code in a checkpoint is refused, never run."""
    import pickle

    try:
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "weights_only" in str(err) or "Unsupported global" in str(err):
            raise BackboneError(
                f"{path} was refused: it holds Python objects besides tensors, which could run "
                "code when loaded. Load only checkpoints you trust; re-save the state dict "
                "(torch.save(model.state_dict(), ...)) or as .safetensors.") from err
        raise BackboneError(_not_a_checkpoint(path, err)) from err
    except Exception as err:
        # garbage makes the unpickler fail in open-ended ways (struct.error, EOFError,
        # KeyError, RuntimeError from the zip reader, ...): all mean "not a checkpoint"
        raise BackboneError(_not_a_checkpoint(path, err)) from err


def _not_a_checkpoint(path: Path, err: BaseException) -> str:
    return (f"{path} is not a readable PyTorch checkpoint ({type(err).__name__}: {err}); it may "
            "be truncated, corrupt or another kind of file renamed. Give the original "
            ".pth/.pt/.ckpt/.bin file or a .safetensors file.")


def load_timm_state(module: nn.Module, state: dict[str, torch.Tensor], source: str,
                    arch: str) -> None:
    """Load ``state`` into a timm ViT, resampling the position embedding to the model's grid.

    A checkpoint as Meta releases DINOv2 (``mask_token``, ``register_tokens``) is first put
    in timm's layout, as ``timm`` does for its own DINOv2 weights.
    """
    state = dinov2_release_to_timm(module, state)
    own = getattr(module, "pos_embed", None)
    if "pos_embed" in state and own is not None and state["pos_embed"].shape != own.shape:
        from timm.layers import resample_abs_pos_embed

        npt = 0 if getattr(module, "no_embed_class", False) else module.num_prefix_tokens
        old_grid = _pos_embed_grid(state["pos_embed"], npt, tuple(module.patch_embed.grid_size),
                                   source, arch)
        try:
            state["pos_embed"] = resample_abs_pos_embed(
                state["pos_embed"], new_size=module.patch_embed.grid_size, old_size=old_grid,
                num_prefix_tokens=npt,
            )
        except RuntimeError as err:  # widths differ: reported below as a shape mismatch
            raise BackboneError(
                f"{source} does not match architecture '{arch}': its position embedding has "
                f"shape {tuple(state['pos_embed'].shape)}, the model's {tuple(own.shape)} "
                f"({err}). Check --arch.") from err
    try:
        missing, unexpected = module.load_state_dict(state, strict=False)
    except RuntimeError as err:  # shape mismatches are raised even with strict=False
        lines = str(err).splitlines()
        raise BackboneError(
            f"{source} does not match architecture '{arch}' (tensor shapes differ: "
            f"{lines[1].strip() if len(lines) > 1 else err}). Check --arch."
        ) from err
    missing = [k for k in missing if not k.startswith(("head.", "fc_norm."))]
    unexpected = [k for k in unexpected if not k.startswith(("head.", "fc_norm."))]
    if missing or unexpected:
        raise BackboneError(
            f"{source} does not match architecture '{arch}': "
            f"{len(missing)} missing keys (e.g. {missing[:3]}), {len(unexpected)} unexpected "
            f"(e.g. {unexpected[:3]}). {_prefix_hint(missing, unexpected)}"
        )


def _prefix_hint(missing: list[str], unexpected: list[str]) -> str:
    """What to do about a key mismatch: when the model's keys are all in the file under one
    prefix ("model.") that other entries kept from being removed, say so, not "Check --arch"
    (the architecture is right)."""
    for prefix in ("model.", "module.", "backbone.", "encoder."):
        named = {k[len(prefix):] for k in unexpected if k.startswith(prefix)}
        others = [k for k in unexpected if not k.startswith(prefix)]
        if missing and others and set(missing) <= named:
            return (f"The file names the model's tensors with the prefix '{prefix}', but it holds "
                    f"{len(others)} other tensor(s) (e.g. {others[:3]}), so the prefix was not "
                    "removed: save only the model's state dict (torch.save(model.state_dict(), "
                    "...)), or as .safetensors.")
    return "Check --arch."


def dinov2_release_to_timm(module: nn.Module, state: dict[str, torch.Tensor]
                           ) -> dict[str, torch.Tensor]:
    """``state`` in timm's layout when it is a DINOv2 checkpoint as Meta releases it (and as
    DINOv2-trained pathology and radiology encoders are often shared), else as it is.

    The release has a ``mask_token`` (used only in training) and, with registers,
    ``register_tokens`` and a position embedding with a class-token row; timm's DINOv2 with
    registers adds no position to the prefix tokens, so that row moves into the class token.
    Without this, a correct --arch was refused as the wrong one ("Check --arch").
    """
    if "mask_token" not in state or "mask_token" in module.state_dict():
        return state
    state = {k: v for k, v in state.items() if k != "mask_token"}
    if "register_tokens" in state and getattr(module, "reg_token", None) is not None:
        state["reg_token"] = state.pop("register_tokens")
        if getattr(module, "no_embed_class", False) and "pos_embed" in state:
            pos = state.pop("pos_embed")
            state["cls_token"] = state["cls_token"] + pos[:, :1]
            state["pos_embed"] = pos[:, 1:]
    # the SwiGLU MLP of ViT-g is named w12 / w3 in the release, fc1 / fc2 in timm
    return {k.replace(".mlp.w12.", ".mlp.fc1.").replace(".mlp.w3.", ".mlp.fc2."): v
            for k, v in state.items()}


def load_state_strict(module: nn.Module, state: dict[str, torch.Tensor], source: str,
                      arch: str) -> None:
    """Load ``state`` into ``module`` replacing every tensor, or refuse it.

    For the bundled architectures, whose own weights must never stand in for a user's file:
    every tensor the module has must be in the file with the same shape and finite values,
    and the file may hold nothing else.

    Raises
    ------
    BackboneError
        Naming ``source``: missing or extra tensors, a different shape, NaN or infinite values.
    """
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    extra = sorted(set(state) - set(own))
    if missing or extra:
        raise BackboneError(
            f"{source} does not hold the weights of '{arch}': {len(missing)} of its tensors are "
            f"missing (e.g. {missing[:3]}) and {len(extra)} are not in it (e.g. {extra[:3]}). "
            "Give a file saved from this architecture, or another --arch.")
    shapes = [(k, tuple(state[k].shape), tuple(v.shape)) for k, v in own.items()
              if state[k].shape != v.shape]
    if shapes:
        key, got, want = shapes[0]
        raise BackboneError(
            f"{source} does not fit '{arch}': {len(shapes)} tensors have other shapes (e.g. "
            f"{key}: {got} in the file, {want} in the model). Check --arch.")
    bad = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise BackboneError(
            f"{source} holds NaN or infinite values in {len(bad)} tensors (e.g. {bad[:3]}); "
            "the training that wrote it diverged or the file is damaged. Give other weights.")
    module.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=True)


def _pos_embed_grid(pos_embed: torch.Tensor, num_prefix: int, model_grid: tuple[int, int],
                    source: str, arch: str) -> tuple[int, int]:
    """The patch grid a position embedding was trained on.

    A square grid is read from the token count. A non-square one is ambiguous (192 tokens
    may be 12×16 or 16×12 or 8×24); it is accepted only when exactly one factorisation has
    the model's own aspect ratio.
    """
    if pos_embed.ndim != 3:
        raise BackboneError(f"{source}: pos_embed has shape {tuple(pos_embed.shape)}, expected "
                            f"(1, tokens, width); it does not fit architecture '{arch}'.")
    n = int(pos_embed.shape[1]) - num_prefix
    side = round(n**0.5) if n > 0 else 0
    if n > 0 and side * side == n:
        return side, side
    gh, gw = model_grid
    shapes = [(h, n // h) for h in range(1, n + 1) if n % h == 0 and h * gw == (n // h) * gh]
    if len(shapes) == 1:
        return shapes[0]
    raise BackboneError(
        f"{source}: the position embedding holds {n} patch positions after {num_prefix} prefix "
        f"token(s), which is not a square grid, and '{arch}' has a {gh}x{gw} grid, so the "
        "grid it was trained on (rows x columns) cannot be read from the file. Re-save the "
        "weights with the position embedding resampled to a square grid, or use the timm "
        "architecture whose img_size matches the training grid.")
