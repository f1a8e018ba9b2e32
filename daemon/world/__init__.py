"""The World: checkpoint, restore and fork a session's whole world at once.

A session's world is its conversation, agent state, task list and layers: the
workspace and, when it has one, its container's writable layer (capture/layers.py).
The World coordinates the snapshotters, the blob store, the metadata store and the
container engine; it never talks gRPC. Every operation on a session holds its
workspace's lock, so a capture never races a restore. History only grows: restore
and fork append a checkpoint and never rewrite one.

The operations are modules of this package around a session core; ``World``
(facade.py) puts them together and is what the rest of the daemon calls.
"""

from .checkpoint import TURN_SECONDS
from .facade import World
from .folders import folder_identity, open_layer_root, remove_folder, symlink_refused
from .fork import ForkResult
from .reads import CheckpointView
from .restore import BEFORE_RESTORE, RestoreResult

__all__ = ["BEFORE_RESTORE", "TURN_SECONDS", "CheckpointView", "ForkResult", "RestoreResult",
           "World", "folder_identity", "open_layer_root", "remove_folder", "symlink_refused"]
