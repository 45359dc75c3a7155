"""One fast constructor of the ingest's frames from typed columns.

``pd.DataFrame(dict_of_columns)`` checks and converts every column in Python (0.3-0.9 ms per
frame; an ingest of the demo fleet builds a few hundred frames). :func:`frame` builds the same
frame (same dtypes, same blocks, same column index) without those checks when every column is
already what pandas would make of it: a numeric or bool numpy array, or a pandas extension
array (a Series is taken by its array). Anything else takes ``pd.DataFrame``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from pandas.api.extensions import ExtensionArray

__all__ = ["frame"]


def frame(cols: dict[str, Any]) -> pd.DataFrame:
    """``pd.DataFrame(cols)`` for a dict of equally long 1-D columns (default index).

    Numpy columns of kinds ``b i u f``, extension arrays, and Series with a default index
    holding either or an object array (kept as object, as pandas keeps a Series' dtype) are
    used as they are (numpy columns are copied into the frame's blocks, as
    pandas does; extension arrays are not copied, so they must not be changed afterwards);
    anything else (object or text numpy arrays, lists, scalars) sends the whole dict to
    ``pd.DataFrame``.
    """
    arrays = []
    n = -1
    for v in cols.values():
        if isinstance(v, pd.Series):
            ix = v.index
            if not (type(ix) is pd.RangeIndex and ix.start == 0 and ix.step == 1):
                return pd.DataFrame(cols)
            if isinstance(v.dtype, np.dtype):  # numpy-backed: object stays object
                v = v.to_numpy()
                if v.dtype.kind not in "biufO":
                    return pd.DataFrame(cols)
            else:
                v = v.array
        elif isinstance(v, np.ndarray):
            if v.ndim != 1 or v.dtype.kind not in "biuf":
                return pd.DataFrame(cols)
        elif not isinstance(v, ExtensionArray) or isinstance(v, pd.arrays.NumpyExtensionArray):
            return pd.DataFrame(cols)
        if n < 0:
            n = len(v)
        elif len(v) != n:
            return pd.DataFrame(cols)
        arrays.append(v)
    if not arrays or len(set(cols)) != len(cols):
        return pd.DataFrame(cols)
    return pd.DataFrame._from_arrays(arrays, columns=list(cols), index=pd.RangeIndex(n),
                                     verify_integrity=False)
