"""The Compute Exchange peer: networking, market loop, executor, persistence, CLI."""
