"""Development tools run from a checkout, never shipped in an image: the local stack that
`make demo` and `make up` supervise (scripts/stack.py)."""
