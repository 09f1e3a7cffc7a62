"""The Docker provider: one image per environment (``images``: recipes and content tags;
``build``: BuildKit builds; ``base``: the offline Debian base), and workers run in containers
(``provider``, ``container``)."""
