"""The types that cross from one stage to the next, defined once; standard library only, so
the worker imports them inside every environment.

- ``status``: ``Status`` (a cell's verdict) and ``Stage`` (export → … → latency);
- ``cell``: ``ExportOptions``, ``CellKey`` (a cell's identity and id), ``CaseRef`` (case syntax);
- ``job``: ``Job`` / ``ExportGroup`` / ``CellJob`` (the worker's input), ``LatencyProtocol``;
- ``record``: ``Record`` with ``Parity`` and ``Latency`` (results.jsonl, schema v1);
- ``run``: ``RunMeta`` (run.json);
- ``env``: ``EnvSpec`` (what an environment installs) and ``EnvMarker`` (what was installed);
- ``paths``: the project root, default store and environments folder;
- ``text``: ``safe_text`` (any case text, safe to encode) and ``bounded_name`` (names as file names).

Takes nothing from the rest of the harness; every other package takes from it.
"""
