"""The model layer: plain single-device PyTorch, no parallelism (``model``), its sizes and
presets (``config``), the packed-attention masks (``docmask``), the losses (``losses``) and
pretrained weights (``pretrained``). Imports only the data layer (``Batch``, ``layout``)."""
