"""The upgrade gate: does bumping torch from a baseline to a candidate break or slow anything?

``sources`` (each side from a stored run or a torch version, run where missing), ``compare``
(one ``Verdict`` per ``CellKey``), ``stats`` (latency significance), ``output`` (gate.md,
junit.xml, gate.json), ``main`` (re-measurement and the exit code).
"""
