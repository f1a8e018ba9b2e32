"""The capture machinery: reading a layer into trees and writing trees back.

``snapshotter`` (the contract: ``Snapshotter`` and its ``Capture``), ``snapshot`` (its
implementations: capture, apply and commit), ``walk`` and ``_walk.c`` (the full scan),
``statcache`` (capture's index of what it read, kept in SQLite), ``tracker`` (inotify
change tracking), ``apply`` and ``fsmeta`` (writing a tree into a layer with its
metadata), ``descriptors`` (what both open a layer's files with), ``sparse``,
``trees`` (manifests and diffs), ``layers`` (workspace and container layers, the
restore journal), ``views`` (overlay forks), ``containers`` (the Docker engine),
``admission`` and ``limits``.

Capture imports neither the world nor the edge (tests/test_layers.py).
"""
