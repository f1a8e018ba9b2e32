"""The edge: where calls come in and errors become statuses. ``server`` (the gRPC
servicer and the error interceptor), ``graph_server`` (LangGraph's servicer),
``gateway`` (the same calls as JSON lines for hooks, or as frames for the Python
client), ``auth`` (tokens, peer uids). Only these modules, ``main`` and ``observe``
speak gRPC."""
