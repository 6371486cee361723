"""An example Diffract kernel pack: statistics of a weight matrix's row norms."""

from diffract_example_pack.kernels import max_row_norm, row_norm_stats

__all__ = ["max_row_norm", "row_norm_stats"]
