"""The error every model-loading failure becomes: a message that says what to do."""

from __future__ import annotations


class BackboneError(ValueError):
    """A model could not be loaded; the message says what to do instead.

    Parameters
    ----------
    message : str
        For scripts and the command line; may name a Python call or a CLI option.
    gui_hint : str, optional
        The same advice in the words of the napari and notebook controls
        (e.g. "use the weights file option"), for front ends to show instead of a call.
    """

    def __init__(self, message: str, *, gui_hint: str | None = None) -> None:
        super().__init__(message)
        self.gui_hint = gui_hint

    def for_gui(self) -> str:
        """The message as the napari and notebook controls show it: what went wrong, then the
        hint in the controls' words instead of a Python call."""
        if not self.gui_hint:
            return str(self)
        first = str(self).split(". ")[0].rstrip(".")
        return f"{first}. {self.gui_hint}"


class UnknownModelError(BackboneError):
    """timm knows no model called ``name``.

    Raised by the timm loaders; :func:`~napari_attnreg.core.models.backbones.load_backbone`,
    which knows every other way a name can be meant (catalogue ids, files, folders), replaces
    it with an error that suggests close names.
    """

    def __init__(self, name: str) -> None:
        super().__init__(f"timm does not know the model '{name}'; timm names: "
                         "timm.list_models('vit*').")
        self.name = name
