"""The pure protocol core of Compute Exchange: no I/O, no clock, no global randomness."""
