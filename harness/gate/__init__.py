"""The upgrade gate: does bumping torch from a baseline to a candidate break or slow anything?

``sources`` (each side from a stored run or a torch version, run where missing), ``compare``
(one ``Verdict`` per ``CellKey``), ``stats`` (the first look on stored figures; the interval of an
interleaved ratio), ``retime`` (the cells timed interleaved: the latency verdict, file or stack),
``output`` (gate.md, junit.xml, gate.json), ``main`` (the torch gate and the exit code).
"""
