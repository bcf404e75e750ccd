"""Constants the strategies share."""

_KINDS = ("float", "int")
# Integer-format data is drawn at a power-of-two scale 2**k, k in this range
# (k = 0 first when shrinking): wide enough to matter, narrow enough that
# every code times the scale is a normal float32.
_INT_SCALE_EXPONENTS = (-8, 8)

Shape = int | tuple[int, ...]
