"""numpy's answers for the tunable operators, the check of a tuning candidate."""
from __future__ import annotations

import numpy as np


def conv2d_reference(data, weight, *, strides, padding, dilation, groups, upsample=(1, 1)):
    """numpy's convolution (NCHW, OIHW, grouped, strided, dilated, padded), the check of a
    tuning candidate."""
    if tuple(upsample) != (1, 1):
        n, c, h, w = data.shape
        spread = np.zeros((n, c, (h - 1) * upsample[0] + 1, (w - 1) * upsample[1] + 1), data.dtype)
        spread[:, :, ::upsample[0], ::upsample[1]] = data
        data = spread
    pt, pl, pb, pr = padding
    data = np.pad(data, ((0, 0), (0, 0), (max(pt, 0), max(pb, 0)), (max(pl, 0), max(pr, 0))))
    h, w = data.shape[2:]
    data = data[:, :, max(-pt, 0):h - max(-pb, 0), max(-pl, 0):w - max(-pr, 0)]
    oc, cg, kh, kw = weight.shape
    (sh, sw), (dh, dw) = strides, dilation
    windows = np.lib.stride_tricks.sliding_window_view(
        data, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]
    n, c, oh, ow = windows.shape[:4]
    windows = windows.reshape(n, groups, cg, oh, ow, kh, kw)
    w = weight.reshape(groups, oc // groups, cg, kh, kw)
    out = np.einsum("ngchwyx,gocyx->ngohw", windows.astype(np.float64), w.astype(np.float64))
    return out.reshape(n, oc, oh, ow).astype(data.dtype)


def dense_reference(data, weight):
    """``data @ weight`` in float64, in ``data``'s dtype."""
    return (data.astype(np.float64) @ weight.astype(np.float64)).astype(data.dtype)
