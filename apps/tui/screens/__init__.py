"""The chat app's modal screens."""

from .ask import AskScreen
from .confirm import ConfirmScreen
from .help import HelpScreen
from .rename import RenameScreen

__all__ = ["AskScreen", "ConfirmScreen", "HelpScreen", "RenameScreen"]
