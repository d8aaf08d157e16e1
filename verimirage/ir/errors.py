"""Errors a user can cause while building or reading programs."""


class GraphError(ValueError):
    """A malformed graph: bad shapes, axes, dtypes, references, or text.

    The message names the op, the operands' shapes and what was expected.
    """
