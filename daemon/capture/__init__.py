"""The capture machinery: reading a layer into trees and writing trees back.

``snapshot`` (the Snapshotter: capture and apply), ``walk`` and ``_walk.c`` (the full
scan), ``tracker`` (inotify change tracking), ``apply`` and ``fsmeta`` (writing a tree
into a layer with its metadata), ``sparse``, ``trees`` (manifests and diffs),
``layers`` (workspace and container layers, the restore journal), ``views`` (overlay
forks), ``containers`` (the Docker engine), ``admission`` and ``limits``.
"""
