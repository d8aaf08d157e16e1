"""Errors a user can cause while building or reading programs."""


class GraphError(ValueError):
    """A malformed graph: bad shapes, axes, dtypes, references, or text.

    The message names the op, the operands' shapes and what was expected; a check's ``GraphError(message, nodes,
    i)`` the node too (shown with its operands where :mod:`.builders`, not the certificate checker, is imported).
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
