"""Host-side sizes of a micro-batch: what a packed step would otherwise read back from the device.

Every size a packed forward needs -- the per-sample token counts that split attention into
segments, the lengths of the packed sequences, the largest patch grid, the fusion's pairs --
is known on the host when the batch is packed (the wire carries each sample's length and
image shape). ``Layout`` holds them as plain Python ints: ``batches.Batch.to`` records one
from the host tensors before they move, ``batches.pack`` completes it with the patch size,
and the model's packed path takes it (``layout=``), so a step reads nothing back from the
device (``test_step_syncs``, docs/trainer.md "No host syncs in the step").

A caller that passes no layout (``None``) gets the sizes read from the tensors (``of_tensors``):
correct everywhere, one device sync per read on an accelerator.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Layout(NamedTuple):
    """Per-sample sizes of one micro-batch, on the host (fields None for a modality the
    rank does not receive)."""

    lengths: tuple[int, ...] | None = None
    """Unpadded caption lengths (0 for an empty padding sample)."""
    shapes: tuple[tuple[int, int], ...] | None = None
    """Each sample's image (height, width) in pixels."""
    neg_text: tuple[int, ...] | None = None
    """The ITM negatives (``losses.itm_negatives``) as indices into the batch."""
    neg_image: tuple[int, ...] | None = None
    patch_size: int | None = None
    """Set by ``batches.pack``: the patch grid of every image is (h // p, w // p)."""

    @property
    def text_counts(self) -> tuple[int, ...]:
        """Packed tokens per caption: max(length, 1) (an empty one keeps a pad token)."""
        return tuple(max(n, 1) for n in self.lengths)

    @property
    def grid(self) -> tuple[tuple[int, int], ...]:
        """Each sample's patch grid (rows, columns)."""
        p = self.patch_size
        return tuple((h // p, w // p) for h, w in self.shapes)

    @property
    def image_counts(self) -> tuple[int, ...]:
        """Packed patches per sample (its rows x columns)."""
        return tuple(r * c for r, c in self.grid)

    @property
    def max_grid(self) -> int:
        """The largest grid side of the batch (0 without images)."""
        return max((max(r, c) for r, c in self.grid), default=0)

    def pairs(self) -> tuple[list[int], list[int]]:
        """The fusion's packed pairs [positive; (i, neg_text[i]); (neg_image[i], i)]: their
        caption token counts and their image token counts ([CLS] included)."""
        b = len(self.neg_text)
        own = list(range(b))
        text, image = self.text_counts, self.image_counts
        txt_idx = own + list(self.neg_text) + own
        img_idx = own + own + list(self.neg_image)
        return [text[i] for i in txt_idx], [image[i] + 1 for i in img_idx]


def _ints(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else tuple(int(v) for v in t.tolist())


def of_tensors(*, lengths: torch.Tensor | None = None, pixel_shape: torch.Tensor | None = None,
               neg_text: torch.Tensor | None = None, neg_image: torch.Tensor | None = None,
               patch_size: int | None = None) -> Layout:
    """The layout read from a batch's tensors: free on the host, a device sync each elsewhere."""
    shapes = None
    if pixel_shape is not None:
        shapes = tuple((int(h), int(w)) for _, h, w in pixel_shape.tolist())
    return Layout(lengths=_ints(lengths), shapes=shapes, neg_text=_ints(neg_text), neg_image=_ints(neg_image),
                  patch_size=patch_size)


def fill(layout: Layout | None, **tensors: torch.Tensor) -> Layout:
    """``layout`` (None: an empty one) with the fields it lacks among ``tensors`` (lengths,
    neg_text, neg_image) read from them: free on the host, a device sync each elsewhere."""
    layout = layout or Layout()
    missing = {k: _ints(v) for k, v in tensors.items() if getattr(layout, k) is None}
    return layout._replace(**missing) if missing else layout


def grid_layout(layout: Layout | None, image_grid: torch.Tensor | None = None, *,
                cu_seqlens: torch.Tensor | None = None) -> Layout:
    """``layout`` with its patch grids; when it has none they are read from ``image_grid``
    (B, 2) or from the offsets ``cu_seqlens`` of packed image features ([CLS] included), as
    1-pixel patches (a device sync off the host)."""
    layout = layout or Layout()
    if layout.shapes is not None and layout.patch_size is not None:
        return layout
    if image_grid is not None:
        shapes = tuple((int(r), int(c)) for r, c in image_grid.tolist())
    else:
        shapes = tuple((int(n) - 1, 1) for n in (cu_seqlens[1:] - cu_seqlens[:-1]).tolist())
    return layout._replace(shapes=shapes, patch_size=1)
