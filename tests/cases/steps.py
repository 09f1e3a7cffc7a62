"""Users' own pipeline steps for the tests: function(src, dst, **args), path in, path out."""
from __future__ import annotations

import os
import shutil


def identity(src: str, dst: str) -> dict:
    shutil.copyfile(src, dst)
    return {"copied": True}


def broken(src: str, dst: str) -> None:
    raise ValueError("this step is broken on purpose")


def aborts(src: str, dst: str) -> None:
    """Kills the process, as a library that segfaults on a file would."""
    os.abort()
