"""`precision.calibrate`: weights converted with what real activations say.

`_record` runs the model and adds up each contraction's input statistics;
`_gptq` is the algorithm on one matrix; `_weight_conversion` turns one weight into a
Tensor; `_calibrate` holds the public entry.
"""

from ._calibrate import calibrate as calibrate

__all__ = ["calibrate"]
