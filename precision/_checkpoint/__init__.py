"""Checkpoints: safetensors files with the storage formats in their metadata.

`_layout` maps a tree of Tensors to named arrays and metadata and back,
`_reader` validates and reads a file, `_io` writes one atomically through
`_atomic_file`, and holds `save` / `load`.
"""

from ._io import load as load
from ._io import save as save

__all__ = ["load", "save"]
