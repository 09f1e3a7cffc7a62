"""matrix.yaml → ``Plan``: the schema and its validation (``config``), rules over a cell's axes
(``rules``: include, exclude, xfail, --only), which environment hosts a cell (``environments``:
companion pins, ``EnvSpec``), the plan itself (``plan``: ``Cell``, ``EnvPlan``, export groups),
deterministic, cost-balanced shards (``shards``) and the shapes CI engines read them in
(``engines``: JSON, GitHub matrix, Kubernetes manifests).

Takes a file path; gives a ``Plan`` of ``EnvPlan``s whose cells carry a ``CellKey`` and whose
export groups are the worker's ``ExportGroup``s. Installs and runs nothing.
"""
