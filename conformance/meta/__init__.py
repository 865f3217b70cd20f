"""Meta tests of the comparison engine: mutant implementations, one per known bug class."""
