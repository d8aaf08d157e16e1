"""Built-in rewrite theories, one module each: algebra, reduction, softmax, norm, concat."""
