"""The error tree of worldline, as the client names it: ``worldline.client.NotFound`` is
``worldline.wire.errors.NotFound``, the one class both sides raise and catch (see
``worldline.wire.errors`` for the tree and what each code means)."""

from worldline.wire.errors import *  # noqa: F403  (every name of its __all__, below)
from worldline.wire.errors import __all__  # noqa: F401
