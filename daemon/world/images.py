"""A checkpoint's container layer as a runnable image (``worldline image export``)."""

from __future__ import annotations

from worldline.wire.errors import FailedPrecondition

from .. import ids
from ..capture.containers import LABEL_CHECKPOINT, LABEL_ROOT
from ..capture.layers import CONTAINER
from ..records import AuditEvent
from .core import Core
from .hold import ContainerHold


def export_image(core: Core, hold: ContainerHold, checkpoint_id: str) -> tuple[str, str]:
    """A runnable image of the checkpoint's container: (image id, reference). Looked
    up by label first, so a retry after a timed-out commit never makes a duplicate."""
    cp = core.usable(checkpoint_id)
    if cp.container is None:
        raise FailedPrecondition(f"checkpoint {cp.id} has no container layer")
    engine = core.require_engine()
    reference = f"worldline/{cp.session_id.lower()}:{cp.id.lower()}"
    for image in engine.images_labelled(LABEL_CHECKPOINT, cp.id):
        if (image.get("Labels") or {}).get(LABEL_ROOT) == core.root_id:
            return image["Id"], reference
    session = core.store.get_session(cp.session_id)
    spec = hold.container_spec(session)
    temp = f"worldline-export-{cp.id.lower()}"
    engine.remove(temp)  # a leftover of an interrupted export
    engine.create_from_spec(spec, temp, session.workspace, session.workspace,
                            core.labels(session.id), volumes="share")
    try:
        layer = core.layer(CONTAINER, engine.upper_dir(temp), track=False)
        layer.snap.apply(layer.snap.capture(persist=False), cp.container)
        repo, tag = reference.split(":")
        image_id = engine.commit(temp, repo, tag, {**core.labels(session.id),
                                                   LABEL_CHECKPOINT: cp.id})
    finally:
        engine.remove(temp)
    core.store.append_audit([AuditEvent("image.export", session.id, cp.id,
                                        {"image": image_id}, ids.now())])
    return image_id, reference
