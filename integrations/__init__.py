"""Integrations of sparsile with other frameworks and file formats.

:mod:`.torch` (``import sparsile.torch``) needs PyTorch (the ``[torch]`` extra) and is imported only
when asked for; :mod:`.safetensors` and :mod:`.sparse24` (the compressed-tensors
``sparse-24-bitmask`` layout) are pure numpy. docs/torch.md describes them.
"""
